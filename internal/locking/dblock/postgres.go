package dblock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// postgresTable is the lock table on PostgreSQL. now() is the database's
// clock (the statement's, as each runs in a transaction of its own), and
// timestamptz is absolute: no instance's clock or time zone enters.
type postgresTable struct {
	pool *pgxpool.Pool
	host string
}

func openPostgres(ctx context.Context, url string, maxConns int) (*postgresTable, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("dblock: parse DATABASE_URL: %w", err)
	}
	cfg.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("dblock: %w", err)
	}
	return &postgresTable{pool: pool, host: fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port)}, nil
}

func micros(d time.Duration) int64 { return d.Microseconds() }

// Take the lock if no one holds it or its holder's lease ran out: one
// statement, so two contenders cannot both see it free. The token grows by
// one with every holder, and the row, once made, stays.
const pgAcquire = `
INSERT INTO stock_locks AS l (name, owner, token, locked_at, expires_at)
VALUES ($1, $2, 1, now(), now() + $3 * interval '1 microsecond')
ON CONFLICT (name) DO UPDATE
   SET owner = EXCLUDED.owner, token = l.token + 1,
       locked_at = EXCLUDED.locked_at, expires_at = EXCLUDED.expires_at
 WHERE l.owner IS NULL OR l.expires_at <= now()
RETURNING token`

func (t *postgresTable) acquire(ctx context.Context, name, owner string, ttl time.Duration) (int64, bool, error) {
	var token int64
	err := t.pool.QueryRow(ctx, pgAcquire, name, owner, micros(ttl)).Scan(&token)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	return token, err == nil, err
}

// Pass a held lock to another owner of the same process, with the next
// token, in one statement: only while it is still the giver's.
const pgHandOver = `
UPDATE stock_locks
   SET owner = $3, token = token + 1, locked_at = now(),
       expires_at = now() + $4 * interval '1 microsecond'
 WHERE name = $1 AND owner = $2 AND expires_at > now()
RETURNING token`

func (t *postgresTable) handOver(ctx context.Context, name, from, to string, ttl time.Duration) (int64, bool, error) {
	var token int64
	err := t.pool.QueryRow(ctx, pgHandOver, name, from, to, micros(ttl)).Scan(&token)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	return token, err == nil, err
}

// Extend the lease, only while it is still the owner's and has not run
// out: a lease that expired may already be someone else's in spirit, and
// its holder has been told it lost it.
const pgRenew = `
UPDATE stock_locks SET expires_at = now() + $3 * interval '1 microsecond'
 WHERE name = $1 AND owner = $2 AND expires_at > now()`

func (t *postgresTable) renew(ctx context.Context, name, owner string, ttl time.Duration) (bool, error) {
	tag, err := t.pool.Exec(ctx, pgRenew, name, owner, micros(ttl))
	return err == nil && tag.RowsAffected() == 1, err
}

// Free the lock, only the owner's own; or, for a job lock that must stay
// taken at least keep from its start, keep it until then: the owner stays,
// the lease ends at locked_at + keep.
const pgRelease = `
UPDATE stock_locks
   SET owner = CASE WHEN locked_at + $3 * interval '1 microsecond' > now() THEN owner END,
       expires_at = CASE WHEN locked_at + $3 * interval '1 microsecond' > now()
                         THEN locked_at + $3 * interval '1 microsecond' END
 WHERE name = $1 AND owner = $2 AND expires_at > now()`

func (t *postgresTable) release(ctx context.Context, name, owner string, keep time.Duration) (bool, error) {
	tag, err := t.pool.Exec(ctx, pgRelease, name, owner, micros(keep))
	return err == nil && tag.RowsAffected() == 1, err
}

// Free a lock whose acquisition's answer was lost, if it went through.
const pgAbandon = `
UPDATE stock_locks SET owner = NULL, expires_at = NULL
 WHERE name = $1 AND owner = $2`

func (t *postgresTable) abandon(ctx context.Context, name, owner string) error {
	_, err := t.pool.Exec(ctx, pgAbandon, name, owner)
	return err
}

// Free the lock whoever holds it (a new sale); the token stays.
const pgReset = `UPDATE stock_locks SET owner = NULL, expires_at = NULL WHERE name = $1`

func (t *postgresTable) reset(ctx context.Context, name string) error {
	_, err := t.pool.Exec(ctx, pgReset, name)
	return err
}

// Make every later token greater than $2: the next holder's is token + 1.
const pgAdvanceFence = `
INSERT INTO stock_locks AS l (name, token) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET token = GREATEST(l.token, EXCLUDED.token)`

func (t *postgresTable) advanceFence(ctx context.Context, name string, atLeast int64) error {
	_, err := t.pool.Exec(ctx, pgAdvanceFence, name, atLeast)
	return err
}

func (t *postgresTable) ping(ctx context.Context) error {
	_, err := t.pool.Exec(ctx, "SELECT 1 FROM stock_locks LIMIT 1")
	return err
}

func (t *postgresTable) addr() string { return t.host }
func (t *postgresTable) close()       { t.pool.Close() }
