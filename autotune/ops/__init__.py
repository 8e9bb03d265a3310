"""Running studies unattended: one study run end to end (locks, traffic refresh, gate, decide),
the nightly daemon and the Prometheus exporter.

May import: every stage below (``core`` .. ``report``).
"""
