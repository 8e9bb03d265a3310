"""Running studies unattended: one study run end to end (``_runner``: prepare, search, confirm, decide,
publish, returning a ``RunResult``), which failure gets which exit code (``_exit``), the nightly
daemon and the Prometheus exporter.

May import: every stage below (``core`` .. ``report``).
"""
