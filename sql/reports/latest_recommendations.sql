-- The current recommendation of every workload.
--   sqlite3 .autotune/autotune.db < sql/reports/latest_recommendations.sql
--   psql "$DATABASE_URL" -f sql/reports/latest_recommendations.sql
SELECT r.workload, r.created_at, r.decision, r.method, r.k, r.speedup,
       r.speedup_ci_low, r.speedup_ci_high, r.incumbent_acceptance_rate,
       r.drift, r.winner_changed, r.study_name, r.reason
FROM autotune_recommendations r
WHERE r.rec_id = (SELECT MAX(r2.rec_id) FROM autotune_recommendations r2
                  WHERE r2.workload = r.workload)  -- rec_id starts with a microsecond timestamp
ORDER BY r.workload;
