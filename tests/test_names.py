"""Names that become file names (a workload, a study, a GPU id) are checked where they enter: the
command line, a spec, a recommendation file's own fields, a traffic log's tag, a setting. None
of them, whatever it holds, makes autotune read or write outside its folders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.core._names import BadName, check_gpu, check_workload, child, workload_problem
from autotune.decide._payload import write_atomic

from test_cli import _rec, env  # noqa: F401  (fixture: studies, recommendations and home folders)
from test_preflight import setup  # noqa: F401  (fixture: a spec on a fake engine)

ROOT = Path(__file__).resolve().parent.parent


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def _autotune(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=60)


# ---- the checks themselves ------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["..", ".", "../outside/pwned", "a/b", "a..b", "-rf", ".hidden", "", "x" * 65,
                                  "code\n", "co\x00de", "co\x1bde", "codé", "a b"])
def test_names_that_could_walk_out_or_confuse_are_refused(name):
    assert workload_problem(name)
    with pytest.raises(BadName, match="is not a workload name"):
        check_workload(name)
    with pytest.raises(BadName, match="is not a GPU id"):
        check_gpu(name)


@pytest.mark.parametrize("name", ["code", "chat-v2", "team_a.summaries", "x" * 64])
def test_ordinary_names_pass(name):
    assert check_workload(name) == name and check_gpu(name) == name
    assert check_gpu("GPU-8c7a0f3e-1d2b-4c5d-9e8f-0a1b2c3d4e5f") and check_gpu(7) == "7"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_property_any_text_is_a_name_inside_its_folder_or_refused(tmp_path_factory, name):
    folder = tmp_path_factory.getbasetemp() / "recs"
    try:
        check_workload(name)
    except BadName as e:
        assert repr(name) in str(e)
        return
    p = child(folder, f"{name}.json")
    assert p.parent == folder and p.name == f"{name}.json"


def test_child_refuses_a_path_out_of_its_folder(tmp_path):
    (tmp_path / "recs").mkdir()
    (tmp_path / "recs" / "history").symlink_to(tmp_path)  # a folder link out: refused too
    for name in ("../x.json", "a/../../x.json", "history/x.json", "..", "."):
        with pytest.raises(BadName, match="outside"):
            child(tmp_path / "recs", name)
    assert child(tmp_path / "recs", "code.json") == tmp_path / "recs" / "code.json"


# ---- where names enter ----------------------------------------------------------------------------
def test_a_recommendation_whose_workload_field_points_out_is_refused_and_nothing_written(env, tmp_path):
    """`recommend mark-deployed code` wrote ../outside/pwned.deployed.json, steered by the file."""
    from click.testing import CliRunner

    from autotune.cli._main import main

    recs = Path(env["AUTOTUNE__RECOMMENDATIONS_DIR"])
    (tmp_path / "outside").mkdir()
    write_atomic(recs / "code.json", {**_rec(), "workload": "../outside/pwned"})
    before = _files(tmp_path)
    for command in (["recommend", "mark-deployed", "code"], ["recommend", "show", "code"]):
        r = CliRunner().invoke(main, command)
        assert (r.exit_code, type(r.exception)) == (2, SystemExit), r.output
        assert r.output.startswith(f"error: {recs / 'code.json'}: not a recommendation autotune wrote "
                                   "(field 'workload' is '../outside/pwned', but the file is code's)"), r.output
    assert _files(tmp_path) == before and not (tmp_path / "outside" / "pwned.deployed.json").exists()


@pytest.mark.parametrize("command", [["recommend", "show"], ["drift", "check"], ["recommend", "history"],
                                     ["recommend", "mark-deployed"], ["study", "show"]])
def test_a_workload_argument_with_a_path_in_it_exits_2_before_reading(env, tmp_path, command):
    """`recommend show ../outside/x` read a spec and a recommendation outside their folders."""
    from click.testing import CliRunner

    from autotune.cli._main import main

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.yaml").write_text((Path(env["AUTOTUNE__STUDIES_DIR"]) / "code.yaml").read_text())
    write_atomic(outside / "x.json", _rec())
    bad = str(Path("..") / Path(env["AUTOTUNE__RECOMMENDATIONS_DIR"]).name / ".." / "outside" / "x")
    r = CliRunner().invoke(main, [*command, bad])
    assert r.exit_code == 2, r.output
    assert f"Invalid value for 'WORKLOAD': {bad!r} is not a workload name" in r.output
    assert "code: change" not in r.output


def test_a_study_name_with_a_path_in_it_exits_2(env):
    from click.testing import CliRunner

    from autotune.cli._main import main

    r = CliRunner().invoke(main, ["study", "start", "--workload", "code", "--study-name", "../../logs-out"])
    assert r.exit_code == 2 and "Invalid value for '--study-name': '../../logs-out' is not a study name" in r.output
    assert not Path(env["AUTOTUNE__HOME"]).exists()


def test_a_spec_whose_workload_walks_out_exits_2_naming_field_and_line(setup):
    setup["data"]["workload"] = ".."  # the pattern let it through: recommendations/history/.. is their parent
    spec = setup["dir"] / "code.yaml"
    spec.write_text(yaml.safe_dump(setup["data"], sort_keys=False))
    r = _autotune(["study", "start", "--workload", "code", "--spec", str(spec)], setup["env"], setup["dir"])
    assert r.returncode == 2, r.stderr
    assert f"error: {spec}:1: field 'workload': '..' is not a workload name" in r.stderr
    assert not setup["marker"].exists()


def test_a_gpu_setting_that_walks_out_of_the_lock_folder_exits_2(setup, tmp_path):
    """AUTOTUNE__GPU='../../../escape' created escape.lock outside the lock folder."""
    spec = setup["dir"] / "code.yaml"
    spec.write_text(yaml.safe_dump(setup["data"], sort_keys=False))
    locks = tmp_path / "a" / "b" / "c" / "locks"
    locks.mkdir(parents=True, mode=0o700)
    env = {**setup["env"], "AUTOTUNE__GPU": "../../../escape", "AUTOTUNE__LOCK_DIR": str(locks)}
    before = _files(tmp_path)
    r = _autotune(["study", "start", "--workload", "code", "--spec", str(spec)], env, setup["dir"])
    assert r.returncode == 2, r.stderr
    assert "error: setting AUTOTUNE__GPU" in r.stderr and "'../../../escape' is not a GPU id" in r.stderr
    assert not [p for p in _files(tmp_path) - before if "escape" in str(p)]


def test_a_traffic_tag_that_walks_out_lands_in_a_pool_inside_the_traffic_folder(tmp_path):
    log = tmp_path / "gw.jsonl"
    log.write_text(json.dumps({"workload": "../../outside/pwned", "endpoint": "completions",
                               "body": {"prompt": "hello", "max_tokens": 8}}) + "\n")
    home = tmp_path / "home"
    r = _autotune(["traffic", "import", "--home", str(home), str(log)], {**__import__("os").environ}, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in (home / "traffic").glob("*.jsonl")) == ["outside-pwned.jsonl"]
    assert not (tmp_path / "outside").exists() and not (tmp_path.parent / "outside").exists()
