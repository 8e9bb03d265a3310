"""Settings that can all come from the environment (``AUTOTUNE__STORAGE=...``).

A scheduler or container sets these once; the CLI's flags override them per call.
"""

from __future__ import annotations

import shlex

from pydantic_settings import BaseSettings, SettingsConfigDict


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

    def vllm_argv(self) -> list[str] | None:
        return shlex.split(self.vllm_command) if self.vllm_command else None


def get_settings() -> Settings:
    return Settings()
