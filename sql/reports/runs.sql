-- Recent runs (daemon jobs, cron, manual, workers): when, where, outcome, cost.
SELECT workload, kind, host, gpu, started_at, finished_at, outcome, exit_code, decision,
       trials, server_starts, failed_trials, study_name
FROM autotune_runs
ORDER BY started_at DESC;
