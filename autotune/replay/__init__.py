"""Stage 2, replay: the asyncio HTTP client and the load generator that sends a replay set to
a server (closed loop, open loop, concurrency profiles) and measures each request.

May import: ``core``, ``traffic``.
"""
