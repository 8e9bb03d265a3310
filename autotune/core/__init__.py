"""Foundations every stage may use: the study spec, settings from the environment, statistics,
time and cron helpers, file locks, signal handling and autotune's own SQL store.

Imports nothing else from autotune: it is the bottom of the pipeline.
"""
