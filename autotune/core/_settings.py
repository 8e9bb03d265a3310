"""Settings that can all come from the environment (``AUTOTUNE__STORAGE=...``).

A scheduler or container sets these once; the CLI's flags override them per call. Each is checked
when the settings load (a ``ValidationError`` the command line turns into exit 2 naming the
variable), so a typo is never silently ignored nor found hours later as a traceback.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from autotune.core._lock import default_lock_dir
from autotune.core._names import check_gpu

#: a host name as RFC 1123 spells it (labels of letters, digits and hyphens, dot-separated)
_HOSTNAME = re.compile(r"(?=.{1,253}\.?$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
                       r"(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?")


class SettingsError(ValueError):
    """A setting (or the option standing for it) this host cannot use, found where it is used
    (a bind address that does not resolve): exit 2, like a setting refused on load."""


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
    vllm_compile_cache: Literal["per-config", "shared"] = "per-config"
    """``per-config``: each speculative configuration compiles into a vLLM cache of its own
    (vLLM 0.25 reuses one K's compiled n-gram kernel for every K, see engines._engine);
    ``shared``: vLLM's default single cache."""
    metrics_addr: str = "127.0.0.1"
    """Prometheus exporter bind address (daemon, `autotune exporter`): an IP address or a host
    name. Whether a name resolves is checked where the exporter binds (``bind_address``), so that
    a resolver outage does not fail the studies that never bind."""
    metrics_port: int = Field(9464, ge=0, le=65535)
    """0: any free port."""

    @field_validator("home", "studies_dir", "recommendations_dir", "lock_dir")
    @classmethod
    def _a_folder(cls, v: str | None) -> str | None:
        if v is not None and "\0" in v:
            raise ValueError("a NUL character in a path")
        if v and Path(v).exists() and not Path(v).is_dir():
            raise ValueError(f"{v} is not a folder")
        return v

    @field_validator("storage")
    @classmethod
    def _a_url(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():  # set but empty: a study ran into the spec's storage instead
            raise ValueError("empty: unset it, or give a database URL")
        return v

    @field_validator("vllm_command")
    @classmethod
    def _a_command(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            argv = shlex.split(v)
        except ValueError as e:  # an unterminated quote
            raise ValueError(f"not a shell-quoted command ({e}): {v}") from None
        if not argv:
            raise ValueError("empty: give the command that runs `vllm serve`, or unset it")
        return v

    @field_validator("metrics_addr")
    @classmethod
    def _an_address(cls, v: str) -> str:
        if v == "" or _HOSTNAME.fullmatch(v):  # "": every interface
            return v
        try:
            ipaddress.ip_address(v.strip("[]"))
        except ValueError:
            raise ValueError(f"{v!r} is neither an IP address nor a host name") from None
        return v

    @field_validator("gpu")
    @classmethod
    def _gpu_id(cls, v: str) -> str:  # it names the lock files: no '/', no '..'
        return check_gpu(v)

    def lock_path(self):
        return Path(self.lock_dir) if self.lock_dir else default_lock_dir(self.home)

    def vllm_argv(self) -> list[str] | None:
        return shlex.split(self.vllm_command) if self.vllm_command else None


def bind_address(addr: str, given_as: str = "AUTOTUNE__METRICS_ADDR") -> str:
    """``addr`` if it resolves on this host, else a SettingsError naming where it came from."""
    import socket

    if addr:
        try:
            socket.getaddrinfo(addr.strip("[]"), None, proto=socket.IPPROTO_TCP)
        except socket.gaierror as e:
            raise SettingsError(f"setting {given_as}: {addr!r} does not resolve on this host "
                                f"({e.strerror}); give an address of this host") from None
    return addr


def get_settings() -> Settings:
    return Settings()
