-- redguard (feature `sqlx`): outcomes of idempotent executions committed in the caller's
-- transaction (`Idempotency::transaction`). Run once per database, before the first such call.
-- Keep foreign keys on (sqlx's default): they refuse a body's own COMMIT.

-- Always empty: a claimed row references id 1 here until redguard fills it, and the deferred
-- check makes a commit of the caller's own (raw COMMIT in the body) fail.
CREATE TABLE IF NOT EXISTS redguard_uncommitted (
    id INTEGER PRIMARY KEY
);

CREATE TABLE IF NOT EXISTS redguard_outcomes (
    scope TEXT NOT NULL,
    idem_key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    owner TEXT NOT NULL,
    result BLOB CHECK (length(result) <= 1048576),
    expires_at INTEGER NOT NULL,
    uncommitted INTEGER REFERENCES redguard_uncommitted (id) DEFERRABLE INITIALLY DEFERRED,
    PRIMARY KEY (scope, idem_key)
);

CREATE INDEX IF NOT EXISTS redguard_outcomes_expires_at ON redguard_outcomes (expires_at);
