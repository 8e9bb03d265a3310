"""Stage 6, trust: production telemetry, the fidelity gate (does the replay reproduce
production?), the drift check, realized vs predicted after a deploy.

May import: every stage below (``core`` .. ``decide``).
"""
