"""Stage 3, engines: what autotune knows of the serving engines, as plug-ins in a registry
(``_registry``: vLLM, llama.cpp's llama-server): capability probe, argv, server lifecycle,
/metrics parsing, per-request TPOT, start-up log notes and phases, orphaned-server recovery.

May import: ``core``, ``traffic``, ``replay``.
"""
