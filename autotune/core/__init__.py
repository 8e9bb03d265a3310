"""Foundations every stage may use: the study spec, settings from the environment, statistics,
time and cron helpers, file locks, signal handling, files and folders written (``_files``), input
files read (``_inputs``), names that become file names (``_names``), autotune's own SQL store,
the exit codes, the progress bars, and the verdicts of start-up cuts (``_cuts``).

May import: nothing else of autotune (the bottom of the pipeline).
"""
