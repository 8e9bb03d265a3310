"""Input files that are not what they claim: a FIFO, a device (``/dev/zero``, or a link to it), a
folder, a socket, a file larger than its kind may be, a gzip that inflates to one huge line.
Every reader refuses them at once, never reads them: exit 2, one ``error:`` line naming the file
(and the line), no hang, bounded memory. Each command runs in a subprocess with a timeout sized
for a host twice as slow and an address-space cap, so a regression fails instead of hanging the
run or exhausting the host; the property tests draw the reader, the kind of file and the size."""

from __future__ import annotations

import gzip
import os
import resource
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from autotune.core._inputs import LIMITS, LINE_LIMIT, InputError, MiB, open_input, read_input, read_lines

from test_preflight import setup  # noqa: F401  (fixture: a spec on a fake engine)

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 60        # seconds: a refused input takes well under one on the 2-core CI host
AS_CAP = 8 * 1024 * MiB   # address space of a command: a regression reading /dev/zero stops here
RSS_CAP = 400 * MiB  # a refused input, or a bomb read in bounded chunks, stays far below

# the peak of the command's own image: VmHWM, which exec resets (getrusage's ru_maxrss keeps the
# forked parent's peak across exec, and the test process's grows with the suite)
_LAUNCH = ("import os, runpy\n"
           "try:\n"
           "    runpy.run_module('autotune', run_name='__main__', alter_sys=True)\n"
           "finally:\n"
           "    hwm = [ln for ln in open('/proc/self/status') if ln.startswith('VmHWM:')][0].split()[1]\n"
           "    with open(os.environ['AUTOTUNE_TEST_RSS'], 'w') as f:\n"
           "        f.write(str(int(hwm) * 1024))\n")


def _limit():
    resource.setrlimit(resource.RLIMIT_AS, (AS_CAP, AS_CAP))


def run_cli(args: list[str], env: dict, cwd: Path) -> tuple[int, str, int]:
    """(exit code, stdout + stderr, peak RSS in bytes) of ``autotune ARGS``; a hang fails the test."""
    rss = cwd / f".rss-{os.getpid()}"
    env = {**env, "AUTOTUNE_TEST_RSS": str(rss), "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1",
           "OMP_NUM_THREADS": "1"}  # no per-core BLAS buffers counted against the address-space cap
    try:
        r = subprocess.run([sys.executable, "-c", _LAUNCH, *args], capture_output=True, text=True, env=env,
                           timeout=TIMEOUT, preexec_fn=_limit, cwd=cwd)
    except subprocess.TimeoutExpired:
        pytest.fail(f"autotune {' '.join(args)} still running after {TIMEOUT} s (it reads what it should refuse)")
    peak = int(rss.read_text()) if rss.exists() else 0
    rss.unlink(missing_ok=True)
    return r.returncode, r.stdout + r.stderr, peak


# ---- special files ----------------------------------------------------------------------------
def make_special(path: Path, kind: str) -> Path:
    """``path`` made a FIFO, a folder, a socket, a link to /dev/zero or a link to a FIFO."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        _SOCKETS.append(s)
    elif kind == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "link to a FIFO":
        os.mkfifo(path.with_name(path.name + ".fifo"))
        path.symlink_to(path.name + ".fifo")
    else:
        raise AssertionError(kind)
    return path


_SOCKETS: list[socket.socket] = []
SPECIAL = ["fifo", "folder", "socket", "link to /dev/zero", "link to a FIFO"]


@pytest.mark.parametrize("kind", SPECIAL)
def test_open_input_refuses_what_is_no_regular_file_without_reading_it(tmp_path, kind):
    p = make_special(tmp_path / "spec.yaml", kind)
    with pytest.raises(InputError) as e:
        read_input(p, "study spec")
    assert str(e.value).startswith(f"{p}: is a") and "not a regular file: refused, not read" in str(e.value)


def test_open_input_refuses_dev_zero_and_a_file_above_its_cap(tmp_path):
    with pytest.raises(InputError, match="^/dev/zero: is a character device"):
        read_input("/dev/zero", "telemetry file")
    big = tmp_path / "r.json"
    with open(big, "wb") as f:
        f.truncate(LIMITS["recommendation"] + 1)  # sparse: nothing written, nothing to read
    with pytest.raises(InputError, match=rf"^{big}: {LIMITS['recommendation'] + 1} bytes, more than a "
                                         r"recommendation may have \(16 MiB\)"):
        read_input(big, "recommendation")
    ok = tmp_path / "ok.json"
    ok.write_bytes(b"{}")
    assert read_input(ok, "recommendation") == b"{}"
    with open_input(ok, "recommendation") as fh:  # blocking again once known to be a regular file
        assert os.get_blocking(fh.fileno()) and fh.read() == b"{}"
    with pytest.raises(FileNotFoundError):  # the caller's own message for a missing file
        read_input(tmp_path / "gone.json", "recommendation")


def test_read_lines_stops_at_the_first_line_above_the_cap(tmp_path):
    p = tmp_path / "log.jsonl.gz"
    p.write_bytes(gzip.compress(b'{"a": 1}\n' + b"x" * 5000 + b"\n{}\n"))
    with gzip.open(p) as fh:
        lines = read_lines(fh, p, limit=4096)
        assert next(lines) == (1, b'{"a": 1}\n')
        with pytest.raises(InputError, match=rf"^{p}:2: a line longer than 4 KiB \(decompressed\)"):
            next(lines)


# ---- through the command line: each reader --------------------------------------------------------
def _env(setup) -> dict:
    return {**setup["env"], "AUTOTUNE__STUDIES_DIR": str(setup["dir"])}


def _spec(setup) -> Path:
    p = setup["dir"] / "code.yaml"
    p.write_text(yaml.safe_dump(setup["data"], sort_keys=False))
    return p


#: reader -> (the command, given the bad file's path and the spec), where the bad file goes
READERS = {
    "study spec": lambda p, spec: ["study", "start", "--workload", "code", "--spec", str(p)],
    "replay set": lambda p, spec: ["drift", "check", "code", "--spec", str(spec), "--replay", str(p)],
    "recommendation": lambda p, spec: ["recommend", "show", "code"],
    "telemetry file": lambda p, spec: ["telemetry", "show", str(p)],
    "storage file": lambda p, spec: ["study", "list", "--storage-file", str(p)],
    "traffic log": lambda p, spec: ["traffic", "import", "--home", str(spec.parent / "home"), str(p)],
}


def _place(setup, reader: str) -> Path:
    """Where the bad file of ``reader`` goes (the recommendation: where its spec puts it)."""
    if reader == "recommendation":
        d = setup["dir"] / "recs"
        d.mkdir(exist_ok=True)
        return d / "code.json"
    return setup["dir"] / {"study spec": "bad.yaml", "replay set": "bad.jsonl", "telemetry file": "t.json",
                           "storage file": "storage.url", "traffic log": "gw.jsonl"}[reader]


def _clear(setup) -> None:
    for reader in READERS:
        p = _place(setup, reader)
        for old in (p, p.with_name(p.name + ".fifo")):
            if old.is_dir() and not old.is_symlink():
                old.rmdir()
            elif old.exists() or old.is_symlink():
                old.unlink()


def _assert_refused(code: int, out: str, p: Path, peak: int) -> None:
    assert code == 2, out
    errors = [ln for ln in out.splitlines() if ln.lower().startswith("error")]
    assert len(errors) == 1 and str(p) in errors[0], out
    assert peak < RSS_CAP, f"peak RSS {peak / MiB:.0f} MiB"


@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_refuses_a_fifo_at_once(setup, reader):
    """A FIFO hung `study start`, `recommend show` and `drift check` (no writer ever comes)."""
    spec = _spec(setup)
    p = make_special(_place(setup, reader), "fifo")
    code, out, peak = run_cli(READERS[reader](p, spec), _env(setup), setup["dir"])
    _assert_refused(code, out, p, peak)
    assert "is a FIFO, not a regular file" in out


@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_refuses_dev_zero_through_a_link(setup, reader):
    """/dev/zero (or a link to it) was read until memory ran out (MemoryError, exit 70)."""
    spec = _spec(setup)
    p = make_special(_place(setup, reader), "link to /dev/zero")
    code, out, peak = run_cli(READERS[reader](p, spec), _env(setup), setup["dir"])
    _assert_refused(code, out, p, peak)
    assert "is a character device, not a regular file" in out


SIZED = [r for r in READERS if r in LIMITS]


@settings(max_examples=len(SIZED) * len(SPECIAL), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(reader=st.sampled_from(list(READERS)), kind=st.sampled_from(SPECIAL))
def test_property_any_reader_any_special_file_exits_2_promptly(setup, reader, kind):
    spec = _spec(setup)
    _clear(setup)  # the fixture's folder is shared by the examples
    p = make_special(_place(setup, reader), kind)
    code, out, peak = run_cli(READERS[reader](p, spec), _env(setup), setup["dir"])
    _assert_refused(code, out, p, peak)


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(reader=st.sampled_from(SIZED), extra=st.integers(min_value=1, max_value=4 * 1024 * MiB))
def test_property_a_file_above_its_cap_exits_2_unread(setup, reader, extra):
    """Any size above the cap (a sparse file: nothing on disk) is refused before a byte is read."""
    spec = _spec(setup)
    _clear(setup)
    p = _place(setup, reader)
    with open(p, "wb") as f:
        f.truncate(LIMITS[reader] + extra)
    code, out, peak = run_cli(READERS[reader](p, spec), _env(setup), setup["dir"])
    _assert_refused(code, out, p, peak)
    assert f"{LIMITS[reader] + extra} bytes, more than a {reader} may have" in out


# ---- compression bombs --------------------------------------------------------------------------
_MEMBER: list[bytes] = []


def bomb(path: Path, line_bytes: int, before: int = 0) -> Path:
    """A gzip whose line ``before + 1`` inflates to ``line_bytes`` bytes: ``before`` short
    request lines, then one member of 1 MiB of 'a' repeated (about 1 KiB each on disk)."""
    if not _MEMBER:
        _MEMBER.append(gzip.compress(b"a" * MiB, compresslevel=9))
    head = b"".join(b'{"endpoint": "completions", "body": {"prompt": "p%d"}}\n' % i for i in range(before))
    with open(path, "wb") as f:
        f.write(gzip.compress(head))
        for _ in range(line_bytes // MiB):
            f.write(_MEMBER[0])
        f.write(gzip.compress(b"a" * (line_bytes % MiB) + b"\n"))
    return path


def test_a_bomb_is_a_gzip_of_one_long_line(tmp_path):
    text = gzip.decompress(bomb(tmp_path / "b.gz", 3 * MiB + 5, before=2).read_bytes())
    assert text.count(b"\n") == 3 and len(text.split(b"\n")[2]) == 3 * MiB + 5


@settings(max_examples=4, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(line=st.integers(min_value=LINE_LIMIT + 1, max_value=1024 * MiB), before=st.integers(0, 3))
@example(line=1024 * MiB, before=0)  # the 1 GiB line of a 1 MB gzip
def test_property_a_compression_bomb_fails_fast_naming_file_and_line(setup, line, before):
    """A 1 MB gzip inflating to one 1 GiB line took 2.2 GB in `traffic import`: now the line is
    refused once its cap is read, the pools are left as they were."""
    log = bomb(setup["dir"] / "gw.jsonl.gz", line, before)
    home = setup["dir"] / "home"
    code, out, peak = run_cli(["traffic", "import", "--home", str(home), str(log)], _env(setup), setup["dir"])
    _assert_refused(code, out, log, peak)
    assert f"{log}:{before + 1}: a line longer than {LINE_LIMIT // MiB} MiB (decompressed)" in out
    assert not list(home.glob("traffic/*.jsonl")) and not list(home.glob("traffic/.*.tmp"))


def test_a_duplicate_replay_id_is_named_with_both_lines_in_one_pass(tmp_path):
    """A replay set whose last id repeats: the check counted each id's occurrences, quadratic in
    the set's length (30,000 lines took 22 s); now a duplicate is found where it is read."""
    from autotune.traffic._replayset import ReplaySetError, load

    n = 20_000
    lines = [f'{{"id": "r{i}", "endpoint": "completions", "body": {{"prompt": "p"}}}}' for i in range(n)]
    lines.append(lines[3])
    p = tmp_path / "dup.jsonl"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(ReplaySetError, match=rf"dup.jsonl:{n + 1}: duplicate request id 'r3' \(first on line 4\)"):
        load(p)
    ok = tmp_path / "ok.jsonl"
    ok.write_text("\n".join(lines[:-1]))
    assert len(load(ok).requests) == n
