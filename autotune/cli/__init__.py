"""The ``autotune`` command line (click), one module per command group.

May import: anything; nothing imports it but ``autotune.__main__``.
"""
