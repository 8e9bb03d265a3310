"""Test and benchmark helpers (a fake vLLM server, a played production); not used by the tuner
itself."""

from ._mock_server import MockServer
from ._production import play_production

__all__ = ["MockServer", "play_production"]
