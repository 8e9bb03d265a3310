-- autotune's own tables, beside Optuna's in the same database (SQLite or PostgreSQL).
-- Portable SQL only: timestamps are UTC text 'YYYY-MM-DDTHH:MM:SSZ' (sortable; both engines
-- parse them), booleans are 0/1 integers, ids are text made by autotune.
-- Applied once, at startup, by autotune.core._store.migrate(); the version lands in
-- autotune_schema_migrations in the same transaction.

-- One row per Optuna study autotune created: what it measured.
CREATE TABLE autotune_studies (
    study_name     TEXT PRIMARY KEY,
    workload       TEXT NOT NULL,
    fingerprint    TEXT NOT NULL,
    model          TEXT NOT NULL,
    vllm_version   TEXT,
    replay_path    TEXT,
    replay_digest  TEXT,
    created_at     TEXT NOT NULL
);

-- One row per `autotune study start`, daemon job or worker: who ran what, and how it ended.
-- outcome: running | ok | failed | interrupted
CREATE TABLE autotune_runs (
    run_id         TEXT PRIMARY KEY,
    workload       TEXT NOT NULL,
    study_name     TEXT,
    kind           TEXT NOT NULL,
    host           TEXT NOT NULL,
    pid            INTEGER NOT NULL,
    gpu            TEXT,
    started_at     TEXT NOT NULL,
    finished_at    TEXT,
    outcome        TEXT NOT NULL,
    exit_code      INTEGER,
    decision       TEXT,
    error          TEXT,
    trials         INTEGER,
    server_starts  INTEGER,
    failed_trials  INTEGER
);
CREATE INDEX autotune_runs_workload ON autotune_runs (workload, started_at);

-- One row per finished trial (the measurement's headline numbers; the full record stays in
-- Optuna's trial user attributes).
CREATE TABLE autotune_trials (
    study_name         TEXT NOT NULL,
    trial_number       INTEGER NOT NULL,
    run_id             TEXT,
    workload           TEXT NOT NULL,
    role               TEXT,
    config_key         TEXT,
    method             TEXT,
    k                  INTEGER,
    state              TEXT NOT NULL,
    tpot_ms            DOUBLE PRECISION,
    acceptance_length  DOUBLE PRECISION,
    acceptance_rate    DOUBLE PRECISION,
    output_tok_s       DOUBLE PRECISION,
    failed_requests    INTEGER,
    server_starts      INTEGER,
    start_seconds      DOUBLE PRECISION,
    error              TEXT,
    host               TEXT,
    log_path           TEXT,
    finished_at        TEXT NOT NULL,
    PRIMARY KEY (study_name, trial_number)
);

-- Every recommendation ever written (the file in recommendations/ is the latest one; its copy
-- is kept in recommendations/history/<workload>/ too).
CREATE TABLE autotune_recommendations (
    rec_id                     TEXT PRIMARY KEY,
    workload                   TEXT NOT NULL,
    created_at                 TEXT NOT NULL,
    run_id                     TEXT,
    study_name                 TEXT,
    decision                   TEXT NOT NULL,
    method                     TEXT,
    k                          INTEGER,
    speedup                    DOUBLE PRECISION,
    speedup_ci_low             DOUBLE PRECISION,
    speedup_ci_high            DOUBLE PRECISION,
    incumbent_acceptance_rate  DOUBLE PRECISION,
    drift                      INTEGER NOT NULL,
    winner_changed             INTEGER NOT NULL,
    reason                     TEXT NOT NULL,
    history_path               TEXT,
    payload                    TEXT NOT NULL
);
CREATE INDEX autotune_recommendations_workload ON autotune_recommendations (workload, created_at);

-- Which trial measures which configuration: the unique key is what keeps two workers (or a
-- resumed run) from measuring the same configuration twice.
CREATE TABLE autotune_claims (
    study_name    TEXT NOT NULL,
    claim_key     TEXT NOT NULL,
    trial_number  INTEGER NOT NULL,
    host          TEXT,
    claimed_at    TEXT NOT NULL,
    PRIMARY KEY (study_name, claim_key)
);
