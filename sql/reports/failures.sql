-- What went wrong: runs that did not end well, then failed trials with their reasons.
SELECT 'run' AS what, workload, started_at AS at, outcome AS state, exit_code AS code,
       host, error AS reason, study_name, NULL AS trial_number
FROM autotune_runs
WHERE outcome NOT IN ('ok', 'running')
UNION ALL
SELECT 'trial' AS what, workload, finished_at AS at, state, NULL AS code,
       host, error AS reason, study_name, trial_number
FROM autotune_trials
WHERE state = 'FAIL'
ORDER BY at DESC;
