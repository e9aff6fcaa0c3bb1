package faults

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// orderRow is one row of the orders table.
type orderRow struct {
	ID       string
	SKU      string
	Quantity int64
	UserID   string
	// Tx names the transaction that inserted the row, as far as the
	// engine shows it: on PostgreSQL its transaction id (xmin), on MySQL
	// its SKU and the timestamp of the INSERT statement (created_at,
	// microseconds: every row of one multi-row INSERT shares it).
	Tx string
}

// keyRow is one row of the idempotency_keys table.
type keyRow struct {
	Key     string
	OrderID string
}

// readRows reads every order and idempotency record of the run's database
// (each run has a database of its own, so all of them are the run's). Each
// engine gets its own plain SQL.
func readRows(ctx context.Context, databaseURL string) ([]orderRow, []keyRow, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if engineOf(databaseURL) == "postgres" {
		return readRowsPostgres(ctx, databaseURL)
	}
	return readRowsMySQL(ctx, databaseURL)
}

// stockRow is one row of the stock table: the sale, its number
// (sale_epoch) and the count of its order rows.
type stockRow struct{ initial, available, saleEpoch, orders int64 }

// readStock reads the stock rows of the run's PostgreSQL database, each
// with the number of its order rows.
func readStock(ctx context.Context, databaseURL string) (map[string]stockRow, error) {
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT s.sku, s.initial, s.available, s.sale_epoch, (SELECT count(*) FROM orders o WHERE o.sku = s.sku) FROM stock s`)
	if err != nil {
		return nil, err
	}
	stock := map[string]stockRow{}
	var sku string
	var row stockRow
	_, err = pgx.ForEachRow(rows, []any{&sku, &row.initial, &row.available, &row.saleEpoch, &row.orders}, func() error {
		stock[sku] = row
		return nil
	})
	return stock, err
}

func readRowsPostgres(ctx context.Context, databaseURL string) ([]orderRow, []keyRow, error) {
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT id::text, sku, quantity, user_id, xmin::text FROM orders`)
	if err != nil {
		return nil, nil, err
	}
	orders, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (orderRow, error) {
		var o orderRow
		err := r.Scan(&o.ID, &o.SKU, &o.Quantity, &o.UserID, &o.Tx)
		return o, err
	})
	if err != nil {
		return nil, nil, err
	}
	rows, err = conn.Query(ctx, `SELECT idempotency_key, order_id::text FROM idempotency_keys`)
	if err != nil {
		return nil, nil, err
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (keyRow, error) {
		var k keyRow
		err := r.Scan(&k.Key, &k.OrderID)
		return k, err
	})
	return orders, keys, err
}

func readRowsMySQL(ctx context.Context, databaseURL string) ([]orderRow, []keyRow, error) {
	db, err := openMySQL(databaseURL)
	if err != nil {
		return nil, nil, err
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, `SELECT id, sku, quantity, user_id, CONCAT(sku, '@', CAST(created_at AS CHAR)) FROM orders`)
	if err != nil {
		return nil, nil, err
	}
	var orders []orderRow
	for rows.Next() {
		var o orderRow
		if err := rows.Scan(&o.ID, &o.SKU, &o.Quantity, &o.UserID, &o.Tx); err != nil {
			_ = rows.Close()
			return nil, nil, err
		}
		orders = append(orders, o)
	}
	if err := rows.Close(); err != nil {
		return nil, nil, err
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	rows, err = db.QueryContext(ctx, `SELECT idempotency_key, order_id FROM idempotency_keys`)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	var keys []keyRow
	for rows.Next() {
		var k keyRow
		if err := rows.Scan(&k.Key, &k.OrderID); err != nil {
			return nil, nil, err
		}
		keys = append(keys, k)
	}
	return orders, keys, rows.Err()
}

// stuckTransactions counts, on PostgreSQL, the sessions of the run's
// database that have sat idle inside a transaction for longer than d while
// other sessions wait for their locks: a process stopped between its
// UPDATE and its COMMIT, whose row lock the others wait for until
// PostgreSQL ends the session (idle_in_transaction_session_timeout). A
// process stopped after a plain read holds no row lock and is not counted.
// -1 when it cannot tell.
func stuckTransactions(ctx context.Context, databaseURL string, d time.Duration) int {
	if engineOf(databaseURL) != "postgres" {
		return -1
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return -1
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var n int
	err = conn.QueryRow(ctx, `
		SELECT count(*) FROM pg_stat_activity a
		WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
		  AND a.state = 'idle in transaction' AND now() - a.state_change > $1::interval
		  AND EXISTS (SELECT 1 FROM pg_stat_activity w WHERE a.pid = ANY(pg_blocking_pids(w.pid)))`,
		fmt.Sprintf("%d milliseconds", d.Milliseconds())).Scan(&n)
	if err != nil {
		return -1
	}
	return n
}

// blockedBy explains, on PostgreSQL, why writers may be stuck: sessions of
// the run's database that sit idle inside a transaction (a paused process
// that has written holds its row locks until it resumes or its connection
// dies) and sessions waiting for a lock. It returns "" when it cannot tell.
func blockedBy(ctx context.Context, databaseURL string) string {
	if engineOf(databaseURL) != "postgres" {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return ""
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var idle, waiting int
	err = conn.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE state = 'idle in transaction'),
		       count(*) FILTER (WHERE wait_event_type = 'Lock')
		FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&idle, &waiting)
	if err != nil {
		return ""
	}
	return fmt.Sprintf(": while it was stopped, PostgreSQL had %d session(s) idle in a transaction and %d waiting for a lock "+
		"(a holder paused after its UPDATE keeps the row locked until it resumes; idle_in_transaction_session_timeout would bound that)", idle, waiting)
}
