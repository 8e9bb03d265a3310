"""Suggest a CPU placement for server and client on this GPU host (prints shell assignments).

    eval "$(python3 benchmarks/gpu/cpus.py)"   # sets AUTOTUNE__SERVER_CPUS and AUTOTUNE__CLIENT_CPUS

The server gets the accelerator's NUMA-local CPUs (``/sys/bus/pci/devices/<bus>/local_cpulist``)
that this process may use, less the client's; the client gets ``--client-cores`` whole physical
cores (hyperthread siblings included, so the server never shares a core with it), taken from the
CPUs outside the local set where there are enough of them, else from the local set's end.
``--explain`` prints the topology it read to stderr.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from autotune.engines._affinity import format_cpulist, parse_cpulist  # noqa: E402


def gpu_local_cpus(index: int = 0) -> set[int] | None:
    try:
        bus = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", str(index)],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    if not bus:
        return None
    path = Path("/sys/bus/pci/devices") / bus.lower()[-12:] / "local_cpulist"  # 00000000:19:00.0 -> 0000:19:00.0
    return set(parse_cpulist(path.read_text().strip(), str(path))) if path.exists() else None


def core_of(cpu: int) -> frozenset[int]:
    p = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
    return parse_cpulist(p.read_text().strip(), str(p)) if p.exists() else frozenset({cpu})


def split(allowed: set[int], local: set[int] | None, client_cores: int) -> tuple[set[int], set[int]]:
    local = (local or set()) & allowed or set(allowed)
    cores = sorted({core_of(c) & allowed for c in allowed}, key=min)
    outside = [c for c in cores if not c & local]
    inside = [c for c in cores if c & local]
    pick = outside[-client_cores:] if len(outside) >= client_cores else inside[-client_cores:]
    client = set().union(*pick) if pick else set()
    server = local - client
    if not server:
        raise SystemExit(f"no CPUs left for the server (allowed {format_cpulist(allowed)}, local {format_cpulist(local)})")
    return server, client


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--client-cores", type=int, default=2)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--explain", action="store_true")
    args = ap.parse_args(argv)
    allowed = os.sched_getaffinity(0)
    local = gpu_local_cpus(args.gpu)
    server, client = split(allowed, local, args.client_cores)
    if args.explain:
        print(f"allowed {format_cpulist(allowed)}; GPU {args.gpu} local "
              f"{format_cpulist(local) if local else 'unknown'}; cores "
              f"{' '.join(format_cpulist(c) for c in sorted({core_of(c) for c in allowed}, key=min))}", file=sys.stderr)
    print(f"export AUTOTUNE__SERVER_CPUS={format_cpulist(server)} AUTOTUNE__CLIENT_CPUS={format_cpulist(client)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
