package dblock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/flashsale/stock/internal/backoff"
	"github.com/flashsale/stock/internal/dburl"
	"github.com/flashsale/stock/internal/mysqlconn"
)

// mysqlTable is the lock table on MySQL/MariaDB. Times are
// UTC_TIMESTAMP(6), the server's clock in UTC: NOW() would follow the
// session's time_zone, and an instance configured with another zone would
// see every lease as expired (or never expiring).
//
// MySQL applies an UPDATE's assignments left to right, each seeing the
// ones before it, so every statement below assigns the columns its
// conditions read last. It has no UPDATE … RETURNING: the new token comes
// back through LAST_INSERT_ID(expr), which the server returns with the
// statement's result.
type mysqlTable struct {
	db   *sql.DB
	host string
}

func openMySQL(url string, maxConns int) (*mysqlTable, error) {
	cfg, hosts, err := dburl.MySQLNodes(url)
	if err != nil {
		return nil, fmt.Errorf("dblock: %w", err)
	}
	// The statements' conditions decide: count the rows they match, not
	// only the ones whose values changed.
	cfg.ClientFoundRows = true
	var connector driver.Connector
	if len(hosts) > 1 {
		// The nodes of a Galera cluster: an acquisition on one node that
		// conflicts with another's fails its certification, and Galera
		// runs an autocommit statement again (wsrep_retry_autocommit),
		// which then finds the lock taken.
		connector, err = mysqlconn.New(cfg, hosts)
	} else {
		connector, err = gomysql.NewConnector(cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("dblock: %w", err)
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	return &mysqlTable{db: db, host: cfg.Addr}, nil
}

// Take the lock if its row says it is free or its lease ran out; a lock
// never taken has no row yet, and the insert below makes it. Each is one
// statement, so two contenders cannot both see it free.
const myAcquire = `
UPDATE stock_locks
   SET owner = ?, token = LAST_INSERT_ID(token + 1), locked_at = UTC_TIMESTAMP(6),
       expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
 WHERE name = ? AND (owner IS NULL OR expires_at <= UTC_TIMESTAMP(6))`

const myCreate = `
INSERT INTO stock_locks (name, owner, token, locked_at, expires_at)
VALUES (?, ?, 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)`

const (
	// erDupEntry: the row exists (someone made it first, and holds it).
	erDupEntry = 1062
	// erLockDeadlock: the statement was rolled back, having done nothing.
	// On Galera it is how an acquisition that lost to another node's
	// write (its certification, or a replicated write that aborted it)
	// ends once wsrep_retry_autocommit is spent.
	erLockDeadlock = 1213
)

func (t *mysqlTable) acquire(ctx context.Context, name, owner string, ttl time.Duration) (int64, bool, error) {
	token, ok, err := t.tokenOf(t.db.ExecContext(ctx, myAcquire, owner, micros(ttl), name))
	if !ok && err == nil {
		_, err = t.db.ExecContext(ctx, myCreate, name, owner, micros(ttl))
		token, ok = 1, err == nil
		if isMySQLError(err, erDupEntry) {
			err = nil
		}
	}
	if isMySQLError(err, erLockDeadlock) {
		// Another node's write of the row won (an acquisition, or a
		// release that freed it): as if the statement had found the lock
		// taken, poll again (found by CI: db-lock through two Galera
		// nodes failed orders with 1213).
		return 0, false, nil
	}
	return token, ok, err
}

// conflictRuns is how many times a statement of the holder's own (renew,
// release, hand-over) or an admin's (reset, fence) runs when Galera
// refuses it for another node's write of the same row, each run after a
// random wait of up to conflictWait·2^run: under a stream of acquisitions
// through another node, three runs in step lost three times.
const (
	conflictRuns = 6
	conflictWait = time.Millisecond
)

// execAgainOnConflict runs a statement that has the same effect run again
// (each one's conditions name the owner, or it sets absolute values), again
// when it failed with 1213, having written nothing: on Galera, a release
// that met another node's reset or fence, failed, would hold the lock up
// for its lease (found by review).
func (t *mysqlTable) execAgainOnConflict(ctx context.Context, query string, args ...any) (sql.Result, error) {
	for run := 1; ; run++ {
		res, err := t.db.ExecContext(ctx, query, args...)
		if run == conflictRuns || !isMySQLError(err, erLockDeadlock) {
			return res, err
		}
		if werr := backoff.Wait(ctx, backoff.Exponential(run, conflictWait, 100*conflictWait)); werr != nil {
			return res, err
		}
	}
}

func isMySQLError(err error, number uint16) bool {
	me, ok := errors.AsType[*gomysql.MySQLError](err)
	return ok && me.Number == number
}

// tokenOf reads the token an UPDATE set through LAST_INSERT_ID(expr).
func (t *mysqlTable) tokenOf(res sql.Result, err error) (int64, bool, error) {
	if err != nil {
		return 0, false, err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return 0, false, err
	}
	token, err := res.LastInsertId()
	return token, err == nil, err
}

const myHandOver = `
UPDATE stock_locks
   SET owner = ?, token = LAST_INSERT_ID(token + 1), locked_at = UTC_TIMESTAMP(6),
       expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
 WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)`

func (t *mysqlTable) handOver(ctx context.Context, name, from, to string, ttl time.Duration) (int64, bool, error) {
	return t.tokenOf(t.execAgainOnConflict(ctx, myHandOver, to, micros(ttl), name, from))
}

const myRenew = `
UPDATE stock_locks SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
 WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)`

func (t *mysqlTable) renew(ctx context.Context, name, owner string, ttl time.Duration) (bool, error) {
	return affectedOne(t.execAgainOnConflict(ctx, myRenew, micros(ttl), name, owner))
}

// Both conditions read locked_at, which neither assignment changes.
const myRelease = `
UPDATE stock_locks
   SET owner = IF(locked_at + INTERVAL ? MICROSECOND > UTC_TIMESTAMP(6), owner, NULL),
       expires_at = IF(locked_at + INTERVAL ? MICROSECOND > UTC_TIMESTAMP(6), locked_at + INTERVAL ? MICROSECOND, NULL)
 WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)`

func (t *mysqlTable) release(ctx context.Context, name, owner string, keep time.Duration) (bool, error) {
	k := micros(keep)
	return affectedOne(t.execAgainOnConflict(ctx, myRelease, k, k, k, name, owner))
}

const myAbandon = `UPDATE stock_locks SET owner = NULL, expires_at = NULL WHERE name = ? AND owner = ?`

func (t *mysqlTable) abandon(ctx context.Context, name, owner string) error {
	_, err := t.execAgainOnConflict(ctx, myAbandon, name, owner)
	return err
}

const myReset = `UPDATE stock_locks SET owner = NULL, expires_at = NULL WHERE name = ?`

func (t *mysqlTable) reset(ctx context.Context, name string) error {
	_, err := t.execAgainOnConflict(ctx, myReset, name)
	return err
}

const myAdvanceFence = `
INSERT INTO stock_locks (name, token) VALUES (?, ?)
ON DUPLICATE KEY UPDATE token = GREATEST(token, VALUES(token))`

func (t *mysqlTable) advanceFence(ctx context.Context, name string, atLeast int64) error {
	_, err := t.execAgainOnConflict(ctx, myAdvanceFence, name, atLeast)
	return err
}

func (t *mysqlTable) ping(ctx context.Context) error {
	_, err := t.db.ExecContext(ctx, "SELECT 1 FROM stock_locks LIMIT 1")
	return err
}

func affectedOne(res sql.Result, err error) (bool, error) {
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return err == nil && n == 1, err
}

func (t *mysqlTable) addr() string { return t.host }
func (t *mysqlTable) close()       { _ = t.db.Close() }
