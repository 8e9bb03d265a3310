"""Prometheus metrics for SREs, read from autotune's tables at every scrape.

Reading the database (not counters in this process) means the numbers survive restarts and
include runs made by cron or other hosts; the daemon adds what only it knows (next scheduled
run). Bound to 127.0.0.1 by default: the exporter has no authentication, and what it shows
(models, configurations) is internal. Metrics, one series per workload:

  autotune_last_run_timestamp_seconds      end of the last finished run
  autotune_last_run_success                1 if it ended ok, else 0
  autotune_last_run_outcome{outcome}       1 for the last run's outcome (ok, failed, interrupted)
  autotune_last_success_timestamp_seconds  end of the last ok run (alert when too old)
  autotune_running                         1 while a run is in progress
  autotune_recommendation_info{decision,method,k}   1, labels of the current recommendation
  autotune_recommended_k                   its num_speculative_tokens (0 = no speculation)
  autotune_recommendation_timestamp_seconds
  autotune_measured_speedup                its measured TPOT speedup (and _ci_low)
  autotune_incumbent_acceptance_rate       measured on the last night's traffic
  autotune_drift                           1 when the last study measured the deployed config's acceptance drifted
                                           below drift.min_acceptance_rate (``decide._history``)
  autotune_last_run_trials / _server_starts / _failed_trials
  autotune_runs_total{outcome}, autotune_trials_total{state}, autotune_server_starts_total,
  autotune_trial_failures_total, autotune_run_failures_total     (counters over all history)
  autotune_store_up{storage}               0 when a database could not be read
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable

from autotune.core._schedule import parse_iso
from autotune.core._settings import bind_address
from autotune.core._store import Store, safe_url, scrub

log = logging.getLogger(__name__)


def _ts(text: str | None) -> float | None:
    return parse_iso(text).timestamp() if text else None


class StoreCollector:
    """A prometheus_client collector over one or more autotune databases."""

    def __init__(self, urls: Iterable[str], extra: Callable[[], list] | None = None):
        self.urls = sorted(set(urls))
        self.extra = extra

    def describe(self):
        return []  # metrics are dynamic; registering must not scrape the database

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        g = {name: GaugeMetricFamily(f"autotune_{name}", doc, labels=labels) for name, doc, labels in (
            ("last_run_timestamp_seconds", "End of the last finished run", ["workload"]),
            ("last_run_success", "1 if the last finished run ended ok", ["workload"]),
            ("last_run_outcome", "1 for the outcome of the last finished run", ["workload", "outcome"]),
            ("last_success_timestamp_seconds", "End of the last run that ended ok", ["workload"]),
            ("running", "1 while a run of the workload is in progress", ["workload"]),
            ("recommendation_info", "The current recommendation", ["workload", "decision", "method", "k"]),
            ("recommended_k", "num_speculative_tokens recommended (0: no speculation)", ["workload"]),
            ("recommendation_timestamp_seconds", "When the current recommendation was made", ["workload"]),
            ("measured_speedup", "Measured TPOT speedup of the recommended config", ["workload"]),
            ("measured_speedup_ci_low", "Lower bound of the speedup's confidence interval", ["workload"]),
            ("incumbent_acceptance_rate", "Incumbent's accepted/drafted tokens, last measured", ["workload"]),
            ("drift", "1 when the current recommendation reports drift", ["workload"]),
            ("last_run_trials", "Trials in the last finished run's study", ["workload"]),
            ("last_run_server_starts", "Server starts of the last finished run's study", ["workload"]),
            ("last_run_failed_trials", "Failed trials in the last finished run's study", ["workload"]),
            ("store_up", "1 if the database could be read", ["storage"]),
        )}
        c = {name: CounterMetricFamily(f"autotune_{name}", doc, labels=labels) for name, doc, labels in (
            ("runs", "Runs by outcome", ["workload", "outcome"]),
            ("trials", "Finished trials by state", ["workload", "state"]),
            ("server_starts", "vllm serve starts", ["workload"]),
            ("trial_failures", "Failed trials (vLLM refused, died, interrupted)", ["workload"]),
            ("run_failures", "Runs that did not end ok", ["workload"]),
        )}
        for url in self.urls:
            try:
                self._collect_one(Store(url), g, c)
                g["store_up"].add_metric([safe_url(url)], 1)
            except Exception as e:
                log.warning("exporter cannot read %s: %s", safe_url(url), scrub(str(e), url))
                g["store_up"].add_metric([safe_url(url)], 0)
        yield from g.values()
        yield from c.values()
        if self.extra:
            yield from self.extra()

    @staticmethod
    def _collect_one(store: Store, g: dict, c: dict) -> None:
        q = store.query
        for r in q("SELECT r.* FROM autotune_runs r WHERE r.outcome <> 'running' AND r.run_id = ("
                   "SELECT r2.run_id FROM autotune_runs r2 WHERE r2.workload = r.workload AND r2.outcome <> 'running' "
                   "ORDER BY r2.finished_at DESC, r2.run_id DESC LIMIT 1)"):
            w = [r["workload"]]
            g["last_run_timestamp_seconds"].add_metric(w, _ts(r["finished_at"]) or 0)
            g["last_run_success"].add_metric(w, 1 if r["outcome"] == "ok" else 0)
            g["last_run_outcome"].add_metric([*w, r["outcome"]], 1)
            g["last_run_trials"].add_metric(w, r["trials"] or 0)
            g["last_run_server_starts"].add_metric(w, r["server_starts"] or 0)
            g["last_run_failed_trials"].add_metric(w, r["failed_trials"] or 0)
        for r in q("SELECT workload, MAX(finished_at) AS t FROM autotune_runs WHERE outcome = 'ok' GROUP BY workload"):
            g["last_success_timestamp_seconds"].add_metric([r["workload"]], _ts(r["t"]) or 0)
        for r in q("SELECT workload, COUNT(*) AS n FROM autotune_runs WHERE outcome = 'running' GROUP BY workload"):
            g["running"].add_metric([r["workload"]], 1 if r["n"] else 0)
        for r in q("SELECT r.* FROM autotune_recommendations r WHERE r.rec_id = (SELECT MAX(r2.rec_id) "
                   "FROM autotune_recommendations r2 WHERE r2.workload = r.workload)"):
            w = [r["workload"]]
            method = r["method"] if r["decision"] != "disable" else "none"
            k = r["k"] if method and method != "none" and r["decision"] != "disable" else 0
            g["recommendation_info"].add_metric([*w, r["decision"], method or "none", str(k or 0)], 1)
            g["recommended_k"].add_metric(w, k or 0)
            g["recommendation_timestamp_seconds"].add_metric(w, _ts(r["created_at"]) or 0)
            if r["speedup"] is not None:
                g["measured_speedup"].add_metric(w, r["speedup"])
            if r["speedup_ci_low"] is not None:
                g["measured_speedup_ci_low"].add_metric(w, r["speedup_ci_low"])
            if r["incumbent_acceptance_rate"] is not None:
                g["incumbent_acceptance_rate"].add_metric(w, r["incumbent_acceptance_rate"])
            g["drift"].add_metric(w, r["drift"] or 0)
        for r in q("SELECT workload, outcome, COUNT(*) AS n FROM autotune_runs GROUP BY workload, outcome"):
            c["runs"].add_metric([r["workload"], r["outcome"]], r["n"])
        for r in q("SELECT workload, COUNT(*) AS n FROM autotune_runs WHERE outcome NOT IN ('ok', 'running') "
                   "GROUP BY workload"):
            c["run_failures"].add_metric([r["workload"]], r["n"])
        for r in q("SELECT workload, state, COUNT(*) AS n, SUM(server_starts) AS s FROM autotune_trials "
                   "GROUP BY workload, state"):
            c["trials"].add_metric([r["workload"], r["state"]], r["n"])
        for r in q("SELECT workload, SUM(server_starts) AS s, "
                   "SUM(CASE WHEN state = 'FAIL' THEN 1 ELSE 0 END) AS f FROM autotune_trials GROUP BY workload"):
            c["server_starts"].add_metric([r["workload"]], r["s"] or 0)
            c["trial_failures"].add_metric([r["workload"]], r["f"] or 0)


def serve(urls: Iterable[str], addr: str = "127.0.0.1", port: int = 9464, extra=None,
          addr_from: str = "AUTOTUNE__METRICS_ADDR"):
    """Start the HTTP endpoint in a background thread; returns (server, thread). ``port=0``
    picks a free port (``server.server_port``). An address that does not resolve is a
    SettingsError naming ``addr_from`` (exit 2), not a resolver traceback."""
    from prometheus_client import CollectorRegistry, start_http_server

    bind_address(addr, addr_from)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(urls, extra))
    return start_http_server(port, addr=addr, registry=registry)
