package faults

import (
	"context"
	"database/sql"
	"time"

	"github.com/jackc/pgx/v5"
)

// lcRow is one order row as the lifecycle's checks read it. Expires and
// Settled are µs since the epoch (UTC), 0 when NULL.
type lcRow struct {
	ID, SKU, User, State string
	Quantity             int64
	Expires, Settled     int64
}

// lcStock is one stock row: the sale's units.
type lcStock struct{ Initial, Restocked, Available int64 }

// lcTables is what the lifecycle's checks read of a run's database.
type lcTables struct {
	orders []lcRow
	stock  map[string]lcStock
	buyers map[[2]string]int64 // (sku, user) -> units of buyer_units
	// unlimited: the run had no PER_USER_LIMIT, so buyer_units is not
	// kept and the buyers' counts are not checked (scenario 13).
	unlimited bool
}

// readLifecycle reads the orders, stock and buyer_units rows of the run's
// database, each engine in its own SQL (the times as µs since the epoch,
// in UTC on both).
func readLifecycle(ctx context.Context, dbURL string) (*lcTables, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	t := &lcTables{stock: map[string]lcStock{}, buyers: map[[2]string]int64{}}
	qOrders := `SELECT id::text, sku, user_id, state, quantity,
		COALESCE((extract(epoch FROM expires_at) * 1000000)::bigint, 0),
		COALESCE((extract(epoch FROM settled_at) * 1000000)::bigint, 0) FROM orders`
	qStock := `SELECT sku, initial, restocked, available FROM stock`
	qBuyers := `SELECT sku, user_id, units FROM buyer_units`
	if engineOf(dbURL) == "postgres" {
		conn, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			return nil, err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		rows, _ := conn.Query(ctx, qOrders)
		var o lcRow
		if _, err := pgx.ForEachRow(rows, []any{&o.ID, &o.SKU, &o.User, &o.State, &o.Quantity, &o.Expires, &o.Settled}, func() error {
			t.orders = append(t.orders, o)
			return nil
		}); err != nil {
			return nil, err
		}
		rows, _ = conn.Query(ctx, qStock)
		var sku string
		var s lcStock
		if _, err := pgx.ForEachRow(rows, []any{&sku, &s.Initial, &s.Restocked, &s.Available}, func() error {
			t.stock[sku] = s
			return nil
		}); err != nil {
			return nil, err
		}
		rows, _ = conn.Query(ctx, qBuyers)
		var user string
		var units int64
		_, err = pgx.ForEachRow(rows, []any{&sku, &user, &units}, func() error {
			t.buyers[[2]string{sku, user}] = units
			return nil
		})
		return t, err
	}
	db, err := openMySQL(dbURL)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	// DATETIME(6) in UTC: TIMESTAMPDIFF from the epoch, which no session
	// time zone shifts.
	qOrders = `SELECT id, sku, user_id, state, quantity,
		COALESCE(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', expires_at), 0),
		COALESCE(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', settled_at), 0) FROM orders`
	each := func(q string, dest func() []any, keep func()) error {
		rows, err := db.QueryContext(ctx, q)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := rows.Scan(dest()...); err != nil {
				return err
			}
			keep()
		}
		return rows.Err()
	}
	var o lcRow
	if err := each(qOrders, func() []any {
		return []any{&o.ID, &o.SKU, &o.User, &o.State, &o.Quantity, &o.Expires, &o.Settled}
	}, func() { t.orders = append(t.orders, o) }); err != nil {
		return nil, err
	}
	var sku, user string
	var s lcStock
	if err := each(qStock, func() []any { return []any{&sku, &s.Initial, &s.Restocked, &s.Available} },
		func() { t.stock[sku] = s }); err != nil {
		return nil, err
	}
	var units int64
	err = each(qBuyers, func() []any { return []any{&sku, &user, &units} },
		func() { t.buyers[[2]string{sku, user}] = units })
	return t, err
}

// lcHeldCount counts the held orders of sku (of every SKU when sku is
// empty), only those whose hold has lapsed by the database's clock when
// lapsedOnly.
func lcHeldCount(ctx context.Context, db *lcDB, sku string, lapsedOnly bool) (int, error) {
	q := `SELECT count(*) FROM orders WHERE state = 'held'`
	var args []any
	if sku != "" {
		q += ` AND sku = ` + db.param(1)
		args = append(args, sku)
	}
	if lapsedOnly {
		q += ` AND expires_at <= ` + db.now()
	}
	var n int
	err := db.queryRow(ctx, q, args, &n)
	return n, err
}

// lcDB is one connection to the run's database, for the scenario's looks
// at it while the load runs.
type lcDB struct {
	url string
	pg  *pgx.Conn
	my  *sql.DB
}

func openLcDB(ctx context.Context, dbURL string) (*lcDB, error) {
	if engineOf(dbURL) == "postgres" {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		conn, err := pgx.Connect(cctx, dbURL)
		if err != nil {
			return nil, err
		}
		return &lcDB{url: dbURL, pg: conn}, nil
	}
	db, err := openMySQL(dbURL)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	return &lcDB{url: dbURL, my: db}, nil
}

func (d *lcDB) close() {
	if d.pg != nil {
		_ = d.pg.Close(context.Background())
	}
	if d.my != nil {
		_ = d.my.Close()
	}
}

func (d *lcDB) param(n int) string {
	if d.pg != nil {
		return "$" + string(rune('0'+n))
	}
	return "?"
}

func (d *lcDB) now() string {
	if d.pg != nil {
		return "statement_timestamp()"
	}
	return "UTC_TIMESTAMP(6)"
}

func (d *lcDB) queryRow(ctx context.Context, q string, args []any, dest ...any) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if d.pg != nil {
		return d.pg.QueryRow(ctx, q, args...).Scan(dest...)
	}
	return d.my.QueryRowContext(ctx, q, args...).Scan(dest...)
}
