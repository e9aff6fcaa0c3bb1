-- +goose Up
-- The lock table of STRATEGY=db-lock and of the single-run job lock
-- (internal/locking/dblock). One row per lock name, kept for ever: token is
-- the lock's fencing counter (the seeds' version column), so the row
-- outlives its holders and a release clears owner instead of deleting it
-- (a deleted row would start the tokens again from 1, below the fence the
-- stock row keeps). A lock is held while owner is set and expires_at lies
-- ahead on the database's clock. (A reentrant owner counts its holds in its
-- own process: the row is one hold.)
CREATE TABLE stock_locks (
    name       text PRIMARY KEY,
    owner      text,
    token      bigint NOT NULL DEFAULT 0,
    locked_at  timestamptz,
    expires_at timestamptz
);

-- +goose Down
DROP TABLE stock_locks;
