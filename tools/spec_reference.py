"""Writes docs/spec.md, the study spec reference, from the pydantic models in autotune/core/_spec.py.

The field descriptions in the code are the one source: a field added or changed there shows up in
the reference the next time this runs, and tests/test_spec_reference.py fails while the committed
page is stale. Usage: ``python tools/spec_reference.py`` (``--check`` only compares).
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import typing
from pathlib import Path

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.core._spec import StudySpec  # noqa: E402

OUT = ROOT / "docs" / "spec.md"
SKIP = {("StudySpec", "source")}  # set by the loader (the file a spec came from), never written in one

INTRO = """# Study spec reference

A study spec is one YAML file per workload, `studies/<workload>.yaml`; `studies/code.yaml` is the
annotated example. Unknown keys are refused, naming the file and the field. Relative paths are
relative to the spec file. Settings from the environment (`AUTOTUNE__...`) override some of these
fields: see [operations](operations.md#settings-from-the-environment).

Generated from the field descriptions in `autotune/core/_spec.py` by
`python tools/spec_reference.py`; edit those, not this page.
"""


def _models(annotation) -> list[type[BaseModel]]:
    """The spec sections an annotation holds (``X | None``, ``list[X]``, ``dict[str, X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models(a)]


def type_name(annotation, sections: dict[type, str]) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is typing.Literal:
        return " or ".join(f'"{a}"' for a in args)
    if origin is typing.Annotated:  # constraints live in the field's description
        return type_name(args[0], sections)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a, sections) for a in args)
    if origin is list:
        return f"list of {type_name(args[0], sections)}"
    if origin is dict:
        return f"map of {type_name(args[0], sections)} to {type_name(args[1], sections)}"
    if annotation is typing.Any:
        return "any"
    if annotation in sections:
        return f"[{sections[annotation]}](#{sections[annotation].replace('.', '')})"
    return annotation.__name__


def default_text(field) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(section)"
    return f"`{json.dumps(value)}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def sections(model: type[BaseModel] = StudySpec, path: str = "", seen: set | None = None) -> list[tuple[str, type[BaseModel]]]:
    """(dotted path, model) of the spec and every section under it, depth first, in field order;
    a model met again (``space.k_per_method`` holds ``space.k``'s) links to its first section."""
    seen = set() if seen is None else seen
    seen.add(model)
    out = [(path, model)]
    for name, field in model.model_fields.items():
        if (model.__name__, name) not in SKIP:
            for sub in _models(field.annotation):
                if sub not in seen:
                    out += sections(sub, f"{path}.{name}" if path else name, seen)
    return out


def render() -> str:
    secs = sections()
    names = {m: p for p, m in secs if p}
    parts = [INTRO]
    for path, model in secs:
        parts.append(f"## {path or 'Top level'}\n")
        doc = (model.__doc__ or "").split("\n\n")[0] if model.__doc__ != BaseModel.__doc__ else ""
        if doc and model is not StudySpec:
            parts.append(" ".join(doc.split()).replace("``", "`") + "\n")
        rows = ["| field | type | default | description |", "|---|---|---|---|"]
        for name, field in model.model_fields.items():
            if (model.__name__, name) in SKIP:
                continue
            rows.append(f"| `{name}` | {_cell(type_name(field.annotation, names))} | {_cell(default_text(field))} "
                        f"| {_cell(field.description or '')} |")
        parts.append("\n".join(rows) + "\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/spec.md is not what the code says")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python tools/spec_reference.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
