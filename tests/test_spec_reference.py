"""docs/spec.md is what autotune/core/_spec.py says: every section and field, with its type,
default and description, and a stale page fails here (regenerate: python tools/spec_reference.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from autotune.core._spec import ReplaySpec, StudySpec

ROOT = Path(__file__).resolve().parent.parent
_loader = importlib.util.spec_from_file_location("spec_reference", ROOT / "tools" / "spec_reference.py")
ref = importlib.util.module_from_spec(_loader)
_loader.loader.exec_module(ref)


def test_the_committed_reference_is_current():
    assert (ROOT / "docs" / "spec.md").read_text() == ref.render(), "run: python tools/spec_reference.py"


def test_every_section_and_field_has_a_row():
    page = ref.render()
    paths = [p for p, _ in ref.sections()]
    assert {"replay", "space.ngram", "objective.start_noise", "production.tolerances"} <= set(paths)
    for path, model in ref.sections():
        assert f"## {path or 'Top level'}\n" in page
        for name in model.model_fields:
            if (model.__name__, name) not in ref.SKIP:
                assert f"| `{name}` |" in page, (path, name)
    assert "| `source` |" not in page   # the loader's, never written in a spec
    assert '| `mode` | "closed" or "open" or "profile" | `"closed"` |' in page
    assert "| `replay` | [replay](#replay) | required |" in page


def test_a_changed_description_makes_the_page_stale(tmp_path, monkeypatch):
    out = tmp_path / "spec.md"
    monkeypatch.setattr(ref, "OUT", out)
    assert ref.main([]) == 0 and ref.main(["--check"]) == 0
    field = ReplaySpec.model_fields["warmup"]
    monkeypatch.setattr(field, "description", "requests sent first, never measured")
    assert "| `warmup` | int | `4` | requests sent first, never measured |" in ref.render()
    assert ref.main(["--check"]) == 1
    assert StudySpec.model_fields["replay"].is_required()
