-- Every recommendation, newest first: what was recommended when, and whether it drifted.
SELECT workload, created_at, decision, method, k, speedup, incumbent_acceptance_rate,
       drift, winner_changed, reason
FROM autotune_recommendations
ORDER BY workload, rec_id DESC;
