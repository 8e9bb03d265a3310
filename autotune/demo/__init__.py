"""The built-in default: tiny Llama models with controlled greedy output and demo replay sets
(``autotune demo setup``).

May import: ``core``, ``traffic``.
"""
