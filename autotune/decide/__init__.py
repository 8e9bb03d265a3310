"""Stage 5, decide: the keep / change / disable decision, the recommendation file and its
history (damping between nights).

May import: every stage below (``core`` .. ``search``).
"""
