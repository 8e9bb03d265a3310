"""Settings that can all come from the environment (``AUTOTUNE__STORAGE=...``).

A scheduler or container sets these once; the CLI's flags override them per call.
"""

from __future__ import annotations

import shlex

from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from autotune.core._lock import default_lock_dir
from autotune.core._names import check_gpu


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AUTOTUNE__", extra="ignore")

    studies_dir: str = "studies"
    storage: str | None = None
    """Optuna RDB URL; overrides the spec's. Default: the spec's, else sqlite in ``home``."""
    recommendations_dir: str | None = None
    vllm_command: str | None = None
    """argv prefix that runs ``vllm serve`` (shell-quoted), overriding every spec's engine.command."""
    vllm_python: str | None = None
    home: str = ".autotune"
    """Working files: server logs, caches, the default database."""
    gpu: str = "0"
    """Which accelerator this process tunes on: names the lock that allows one study per GPU."""
    hardware: str | None = None
    """What the trials run on, for the study fingerprint (default: detected, see engines._hardware)."""
    lock_dir: str | None = None
    """Where the GPU locks and server pidfiles live (default: $XDG_RUNTIME_DIR/autotune, else
    <home>/locks); a private folder (0700, yours): any other is refused."""
    server_cpus: str | None = None
    """CPUs for every server start (cpulist, e.g. ``0-11``: the accelerator's local cores, as
    ``nvidia-smi topo -m`` lists them), so that every start runs where the last one did."""
    client_cpus: str | None = None
    """CPUs for the load generator (this process while it measures), apart from the server's."""
    vllm_compile_cache: str = "per-config"
    """``per-config``: each speculative configuration compiles into a vLLM cache of its own
    (vLLM 0.25 reuses one K's compiled n-gram kernel for every K, see engines._engine);
    ``shared``: vLLM's default single cache."""
    metrics_addr: str = "127.0.0.1"
    """Prometheus exporter bind address (daemon, `autotune exporter`)."""
    metrics_port: int = 9464

    @field_validator("gpu")
    @classmethod
    def _gpu_id(cls, v: str) -> str:  # it names the lock files: no '/', no '..'
        return check_gpu(v)

    def lock_path(self):
        from pathlib import Path

        return Path(self.lock_dir) if self.lock_dir else default_lock_dir(self.home)

    def vllm_argv(self) -> list[str] | None:
        return shlex.split(self.vllm_command) if self.vllm_command else None


def get_settings() -> Settings:
    return Settings()
