"""`--json` on the show and list commands: plain JSON on stdout that other tools can read, the same
facts as the text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from _synthetic import Workload
from test_search_study import RATES, fake_measure, make_spec
from autotune.cli._main import main
from autotune.core._settings import Settings
from autotune.engines import _probe
from autotune.engines._probe import Capabilities
from autotune.ops import _runner
from autotune.search import _study

CAPS = Capabilities(version="0.32.0", methods=["ngram"], fields=["method", "num_speculative_tokens",
                    "prompt_lookup_min", "prompt_lookup_max"], arctic_inference=False)


def synthetic_workload(mp, d: Path) -> None:
    """The synthetic workload ``syn`` in ``d``: its spec, a probe that answers CAPS, and the
    synthetic measurement instead of server starts (``mp``: a pytest MonkeyPatch)."""
    mp.setattr(_probe, "probe", lambda *a, **k: CAPS)
    for k in ("AUTOTUNE__STORAGE", "AUTOTUNE__RECOMMENDATIONS_DIR"):
        mp.delenv(k, raising=False)
    make_spec(d, budget={"max_trials": 8, "max_server_starts": 10, "max_wall_minutes": 10})
    mp.setenv("AUTOTUNE__HOME", str(d / "home"))
    mp.setenv("AUTOTUNE__STUDIES_DIR", str(d))
    mp.setattr(_study, "measure", fake_measure(Workload(rates=RATES)))


@pytest.fixture(scope="module")
def studied(tmp_path_factory):
    """One finished study of the synthetic workload, its recommendation written."""
    mp = pytest.MonkeyPatch()
    d = tmp_path_factory.mktemp("studied")
    synthetic_workload(mp, d)
    res = _runner.execute(_runner.RunRequest(workload="syn", spec_path=str(d / "syn.yaml")), settings=Settings(),
                          echo=lambda *a, **k: None)
    assert res.exit_code == 0, res.messages
    yield res
    mp.undo()


def _json(*args):
    r = CliRunner().invoke(main, list(args))
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_study_list_json(studied):
    rows = _json("study", "list", "--json")
    row = next(r for r in rows if r["study"] == studied.study)
    assert row["trials"] == studied.trials and isinstance(row["best_tpot_ms"], float)
    text = CliRunner().invoke(main, ["study", "list"]).output
    assert f"{row['best_tpot_ms']:.2f} ms" in text and row["storage"] in text


def test_study_show_json(studied):
    shown = _json("study", "show", "syn", "--json")
    assert shown["study"] == studied.study and len(shown["trials"]) == studied.trials
    t0 = shown["trials"][0]
    assert t0["number"] == 0 and t0["role"] == "baseline" and t0["config"] is None and t0["state"] == "COMPLETE"
    assert isinstance(t0["tpot_ms"], float) and t0["config_key"] == "none"
    text = CliRunner().invoke(main, ["study", "show", "syn"]).output.splitlines()
    assert text[0] == f"study {shown['study']} ({shown['storage']})"
    times = [line for line in text[1:] if line.startswith(("    time: ", "where the time went: "))]
    assert len(times) == sum(1 for t in shown["trials"] if t["timeline"]) + bool(shown["seconds_by_phase"])
    for t, line in zip(shown["trials"], [line for line in text[1:] if line not in times]):
        assert line.split()[:2] == [str(t["number"]), t["role"]] and f"tpot {t['tpot_ms']:7.2f} ms" in line


def test_recommend_show_and_history_json(studied):
    rec = _json("recommend", "show", "syn", "--json")
    assert rec == json.loads(Path(studied.recommendation).read_text())
    history = _json("recommend", "history", "syn", "--json")
    assert len(history) == 1 and history[0]["decision"] == studied.decision == rec["decision"]
    assert history[0]["id"] == rec["id"]
