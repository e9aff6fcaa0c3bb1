package faults

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// catchSweeper catches an instance mid-sweep, its sweep transaction open
// with every write done and its commit not sent. The sweep gives units
// back last, every SKU of its batch by one statement that takes their rows
// in SKU order (Tx.ReturnEach), so a
// lock the scenario holds on sku's stock row — a SKU nobody else orders
// now — makes the sweeper that expired lapsed holds of sku wait there,
// with its batch locked and changed. The waiting session names its
// instance (by client port); the instance is stopped (SIGSTOP), the
// scenario's lock let go, and the stopped instance's UPDATE finishes on
// the server: the transaction stays open, as a client stopped before its
// COMMIT leaves it. It is then checked to hold the batch (ten rows or
// more: an order, a pay or a cancel touches three): on PostgreSQL the lock
// manager names who holds a lapsed hold's row lock, on MariaDB
// information_schema.innodb_trx counts its transaction's rows. It returns
// the instance, stopped, the rows, and the tries; nil when none was
// caught.
func catchSweeper(ctx context.Context, instances []*Instance, db *lcDB, sku string) (*Instance, int, int, error) {
	var err error
	var n int
	if !waitUntil(ctx, 10*time.Second, func() bool {
		n, err = lcHeldCount(ctx, db, sku, true)
		return err != nil || n > 0
	}) || err != nil {
		return nil, 0, 0, fmt.Errorf("no hold of %s lapsed within 10s: %v", sku, err)
	}
	for try := 1; try <= 3; try++ {
		in, rows, err := db.catchOnce(ctx, instances, sku)
		if err != nil || in != nil {
			return in, rows, try, err
		}
		if n, err = lcHeldCount(ctx, db, sku, false); err != nil || n == 0 {
			return nil, 0, try, err
		}
	}
	return nil, 0, 3, nil
}

// catchOnce is one try of catchSweeper.
func (d *lcDB) catchOnce(ctx context.Context, instances []*Instance, sku string) (*Instance, int, error) {
	gate, err := d.lockStock(ctx, sku)
	if err != nil {
		return nil, 0, err
	}
	// The sweep runs every second: wait up to three for it to queue.
	var port int
	var qerr error
	waitUntil(ctx, 3*time.Second, func() bool {
		port, qerr = gate.waiter(ctx)
		return qerr != nil || port != 0
	})
	var victim *Instance
	if qerr == nil && port != 0 {
		for _, in := range instances {
			if ports, err := socketPorts(in.p.pid()); err == nil && ports[port] {
				victim = in
				break
			}
		}
	}
	if victim != nil {
		qerr = errors.Join(qerr, victim.Pause())
	}
	qerr = errors.Join(qerr, gate.release())
	if qerr != nil || victim == nil {
		return nil, 0, qerr
	}
	// Its UPDATE of the stock row finishes once the lock is let go. (Its
	// instance's other sessions may stay active: an order of a SKU whose
	// stock row the stopped sweep has updated waits for it.)
	ports := map[int]bool{port: true}
	var active bool
	settled := waitUntil(ctx, 2*time.Second, func() bool {
		active, qerr = d.activeOf(ctx, ports)
		return qerr != nil || !active
	})
	rows := 0
	if settled && qerr == nil {
		rows, qerr = d.openRows(ctx, sku, ports)
	}
	if qerr != nil || rows < 10 {
		return nil, 0, errors.Join(qerr, victim.Resume())
	}
	return victim, rows, nil
}

// stockGate is a transaction holding a stock row's lock.
type stockGate struct {
	pg  pgx.Tx
	my  *sql.Tx
	pid int
}

// lockStock locks sku's stock row in a transaction of the scenario's own.
func (d *lcDB) lockStock(ctx context.Context, sku string) (*stockGate, error) {
	g := &stockGate{}
	if d.pg != nil {
		tx, err := d.pg.Begin(ctx)
		if err != nil {
			return nil, err
		}
		g.pg = tx
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&g.pid); err != nil {
			return nil, errors.Join(err, g.release())
		}
		if _, err := tx.Exec(ctx, `SELECT 1 FROM stock WHERE sku = $1 FOR UPDATE`, sku); err != nil {
			return nil, errors.Join(err, g.release())
		}
		return g, nil
	}
	tx, err := d.my.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	g.my = tx
	if _, err := tx.ExecContext(ctx, `SELECT 1 FROM stock WHERE sku = ? FOR UPDATE`, sku); err != nil {
		return nil, errors.Join(err, g.release())
	}
	return g, nil
}

// waiter returns the client port of a session whose sweep waits for the
// gate's lock (0: none yet), from the server's live views: PostgreSQL's
// lock manager; MariaDB's process list, where a session waiting for a row
// lock shows its statement.
func (g *stockGate) waiter(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var port int
	if g.pg != nil {
		// Within a transaction pg_stat_activity answers from the snapshot
		// of its first read, unless that is cleared.
		if _, err := g.pg.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
			return 0, err
		}
		err := g.pg.QueryRow(ctx, `SELECT COALESCE(min(client_port), 0) FROM pg_stat_activity
			WHERE $1 = ANY(pg_blocking_pids(pid)) AND query LIKE '%SET available = available +%'`, g.pid).Scan(&port)
		return port, err
	}
	var host sql.NullString
	err := g.my.QueryRowContext(ctx, `SELECT min(HOST) FROM information_schema.PROCESSLIST
		WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND COMMAND = 'Query' AND INFO LIKE '%SET available = available +%'`).Scan(&host)
	if err != nil || !host.Valid {
		return 0, err
	}
	return portOf(host.String), nil
}

func (g *stockGate) release() error {
	if g.pg != nil {
		return g.pg.Rollback(context.Background())
	}
	return g.my.Rollback()
}

// openRows returns the rows the open transaction of the sessions whose
// client port is in ports holds: on PostgreSQL, the lapsed holds of sku
// another transaction has locked, if a session of ports is the one the
// lock manager names for the first; on MariaDB, the most rows one of them
// has locked or changed (information_schema.innodb_trx, read once its
// cache is current: see innodbTrxIdle).
func (d *lcDB) openRows(ctx context.Context, sku string, ports map[int]bool) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if d.pg != nil {
		locked, err := d.pgLockedHolds(ctx, sku)
		if err != nil || len(locked) == 0 {
			return 0, err
		}
		port, err := d.pgHolderOf(ctx, locked[0])
		if err != nil || !ports[port] {
			return 0, err
		}
		return len(locked), nil
	}
	pause(ctx, innodbTrxIdle)
	rows, err := d.my.QueryContext(ctx, `SELECT p.HOST, GREATEST(t.trx_rows_locked, t.trx_rows_modified)
		FROM information_schema.PROCESSLIST p JOIN information_schema.INNODB_TRX t ON t.trx_mysql_thread_id = p.ID
		WHERE p.DB = DATABASE() AND p.ID <> CONNECTION_ID() AND p.COMMAND = 'Sleep'`)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	most := 0
	for rows.Next() {
		var host string
		var n int
		if err := rows.Scan(&host, &n); err != nil {
			return 0, err
		}
		if ports[portOf(host)] {
			most = max(most, n)
		}
	}
	return most, rows.Err()
}

// activeOf reports whether a session whose client port is in ports runs a
// statement, from the server's live session list.
func (d *lcDB) activeOf(ctx context.Context, ports map[int]bool) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if d.pg != nil {
		rows, _ := d.pg.Query(ctx, `SELECT client_port FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND client_port IS NOT NULL AND state = 'active'`)
		defer rows.Close()
		for rows.Next() {
			var port int
			if err := rows.Scan(&port); err != nil {
				return false, err
			}
			if ports[port] {
				return true, nil
			}
		}
		return false, rows.Err()
	}
	rows, err := d.my.QueryContext(ctx, `SELECT HOST FROM information_schema.PROCESSLIST
		WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND COMMAND = 'Query'`)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	for rows.Next() {
		var host string
		if err := rows.Scan(&host); err != nil {
			return false, err
		}
		if ports[portOf(host)] {
			return true, nil
		}
	}
	return false, rows.Err()
}

func portOf(host string) int {
	p, _ := strconv.Atoi(host[strings.LastIndexByte(host, ':')+1:])
	return p
}

// innodbTrxIdle is how long InnoDB serves information_schema.innodb_trx
// from its cache after the last read: the scenario reads it after that
// long without a read (it is the private server's only reader), so the
// view is current.
const innodbTrxIdle = 110 * time.Millisecond

// pgLockedHolds returns the lapsed holds of sku that another transaction
// has locked. Its own locks go with its rollback, a moment later.
func (d *lcDB) pgLockedHolds(ctx context.Context, sku string) ([]string, error) {
	tx, err := d.pg.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	const lapsed = `SELECT id::text FROM orders WHERE sku = $1 AND state = 'held' AND expires_at <= statement_timestamp()`
	rows, _ := tx.Query(ctx, lapsed, sku)
	all, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	rows, _ = tx.Query(ctx, lapsed+` FOR UPDATE SKIP LOCKED`, sku)
	free, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	var locked []string
	for _, id := range all {
		if !slices.Contains(free, id) {
			locked = append(locked, id)
		}
	}
	return locked, nil
}

// pgHolderOf returns the client port of the session holding order id's
// row lock (0 when none is found within a second): a session of its own
// waits for the row, for at most a second, and the lock manager names
// whom it waits for.
func (d *lcDB) pgHolderOf(ctx context.Context, id string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	waiter, err := pgx.Connect(ctx, d.url)
	if err != nil {
		return 0, err
	}
	defer waiter.Close(context.WithoutCancel(ctx))
	var pid int
	if err := waiter.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return 0, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Ends by lock_timeout, or at once if the row is free.
		_, _ = waiter.Exec(ctx, `SET lock_timeout = '1s'`)
		tx, err := waiter.Begin(ctx)
		if err != nil {
			return
		}
		_, _ = tx.Exec(ctx, `SELECT 1 FROM orders WHERE id::text = $1 FOR UPDATE`, id)
		_ = tx.Rollback(context.WithoutCancel(ctx))
	}()
	defer func() { <-done }()
	port := 0
	var qerr error
	waitUntil(ctx, time.Second, func() bool {
		qerr = d.pg.QueryRow(ctx, `SELECT COALESCE((SELECT a.client_port FROM pg_stat_activity a
			WHERE a.pid = (pg_blocking_pids($1))[1]), 0)`, pid).Scan(&port)
		return qerr != nil || port != 0
	})
	return port, qerr
}
