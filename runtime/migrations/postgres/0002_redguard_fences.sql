-- redguard (feature `sqlx`): the newest fencing token each resource's writes carried
-- (`redguard::lock::begin_fenced`). Run once per database, before the first such call.
-- Rows are never expired: a resource's row going away would let a stale lock holder's write
-- through again. One row per resource a lock guards; delete rows only of resources no lock
-- guards any more.
CREATE TABLE IF NOT EXISTS redguard_fences (
    resource TEXT PRIMARY KEY,
    fence BIGINT NOT NULL
);
