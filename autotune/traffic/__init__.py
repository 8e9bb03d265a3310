"""Stage 1, traffic: gateway/bench/trace log readers, workload tags, per-workload pools,
deterministic stratified sampling, and the replay sets that every later stage reads.

May import: ``core``.
"""
