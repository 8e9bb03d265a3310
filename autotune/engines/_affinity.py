"""CPU placement of the server and of the load generator (``AUTOTUNE__SERVER_CPUS``,
``AUTOTUNE__CLIENT_CPUS``).

On a GPU host the speculative step has host work on its critical path (the CPU n-gram proposer
runs synchronously, the scheduler and the API server run every step), and the client that drives
the load runs on the same host. Left to the OS, each server start lands its processes on other
cores, NUMA nodes and hyperthread siblings of the client, one candidate for why starts of one
configuration differ by more than their requests do. Pinning the server to the accelerator's
local cores and the client to others makes every start of a study run on the same cores.
Off by default: a host without spare cores gains nothing from it.
"""

from __future__ import annotations

import itertools
import os
import re

_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+))?\s*$")
MAX_CPU = 8191
"""The largest CPU id Linux can name (NR_CPUS is at most 8192): a range past it is a typo, and
building it (``0-4294967295``) ran out of memory."""


def parse_cpulist(text: str, name: str) -> frozenset[int]:
    """``"0-7,16"`` -> {0..7, 16} (the kernel's cpulist syntax, as ``taskset -c`` and
    ``nvidia-smi topo -m`` print it). ``name`` (the setting) is in every error."""
    cpus: set[int] = set()
    for part in text.split(","):
        m = _RANGE.match(part)
        if not m:
            raise ValueError(f"{name}: {text!r} is not a CPU list ({part.strip()!r}; write e.g. 0-7,16)")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ValueError(f"{name}: {text!r}: range {lo}-{hi} runs backwards")
        if hi > MAX_CPU:
            raise ValueError(f"{name}: {text!r}: CPU {hi} is beyond any CPU id Linux names (0-{MAX_CPU})")
        cpus.update(range(lo, hi + 1))
    return frozenset(cpus)


def format_cpulist(cpus) -> str:
    """{0, 1, 2, 5} -> ``"0-2,5"``: how a row records the placement it ran with."""
    runs = [[c for _, c in g] for _, g in itertools.groupby(enumerate(sorted(cpus)), lambda x: x[1] - x[0])]
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def placement(server_cpus: str | None, client_cpus: str | None) -> tuple[frozenset[int] | None, frozenset[int] | None]:
    """The two settings checked against the CPUs this process may use: each a subset of them,
    the two disjoint (a client sharing the server's cores is what pinning is meant to prevent)."""
    allowed = os.sched_getaffinity(0)
    sets = []
    for name, text in (("AUTOTUNE__SERVER_CPUS", server_cpus), ("AUTOTUNE__CLIENT_CPUS", client_cpus)):
        if not text:
            sets.append(None)
            continue
        cpus = parse_cpulist(text, name)
        missing = cpus - allowed
        if missing:
            raise ValueError(f"{name}: CPUs {format_cpulist(missing)} are not available to this process "
                             f"(it may use {format_cpulist(allowed)})")
        sets.append(cpus)
    server, client = sets
    if server and client and server & client:
        raise ValueError(f"AUTOTUNE__SERVER_CPUS and AUTOTUNE__CLIENT_CPUS share CPUs {format_cpulist(server & client)}")
    return server, client


def pin_current_thread(cpus: frozenset[int] | None) -> None:
    """Pin the calling thread (and every thread and process it creates later): the client's."""
    if cpus:
        os.sched_setaffinity(0, cpus)


def pinner(cpus: frozenset[int] | None):
    """A ``preexec_fn`` that pins the server process before it execs (its workers inherit it)."""
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, cpus)
