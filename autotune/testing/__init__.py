"""Test helpers (a fake vLLM server); not used by the tuner itself."""

from ._mock_server import MockServer

__all__ = ["MockServer"]
