"""Test and benchmark helpers (a fake vLLM server, a played production); nothing in the tuner
imports them.
May import: ``engines``, ``replay``, ``traffic``, ``trust`` (a played production serves a real
engine, replays through the client and writes telemetry).
"""

from ._mock_server import MockServer
from ._production import play_production

__all__ = ["MockServer", "play_production"]
