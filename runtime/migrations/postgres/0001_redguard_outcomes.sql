-- redguard (feature `sqlx`): outcomes of idempotent executions committed in the caller's
-- transaction (`Idempotency::transaction`). Run once per database, before the first such call.

-- Always empty: a claimed row references id 1 here until redguard fills it, and the deferred
-- check makes a commit of the caller's own (raw COMMIT in the body) fail.
CREATE TABLE IF NOT EXISTS redguard_uncommitted (
    id BIGINT PRIMARY KEY
);

CREATE TABLE IF NOT EXISTS redguard_outcomes (
    scope TEXT NOT NULL,
    idem_key TEXT NOT NULL,
    -- SHA-256 prefix of the payload, hex.
    fingerprint TEXT NOT NULL,
    -- The execution that claimed the row.
    owner TEXT NOT NULL,
    -- The result as JSON; NULL only while uncommitted.
    result BYTEA CHECK (octet_length(result) <= 1048576),
    -- Unix milliseconds, the application's clock.
    expires_at BIGINT NOT NULL,
    uncommitted BIGINT REFERENCES redguard_uncommitted (id) DEFERRABLE INITIALLY DEFERRED,
    PRIMARY KEY (scope, idem_key)
);

-- The retention job's `expires_at < now` (redguard::idempotency::purge_expired).
CREATE INDEX IF NOT EXISTS redguard_outcomes_expires_at ON redguard_outcomes (expires_at);
