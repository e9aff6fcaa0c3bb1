package explore

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	dbstore "github.com/flashsale/stock/internal/store"
)

// Clock ends holds when the scheduler says: its "hold N: lapses" step. The
// harness cannot move the database's clock, so it moves the hold's
// expires_at into the past on that clock instead, with one UPDATE over a
// connection of its own. That UPDATE waits for the row lock of a
// transaction that is moving the order, so the scheduler watches the
// connection's session as it watches a buyer's.
type Clock struct {
	session int64
	// mu: one statement at a time on the one connection (the scheduler
	// grants one lapse at a time anyway).
	mu    sync.Mutex
	lapse func(ctx context.Context, orderID string) error
	close func()
}

// OpenClock connects to the server of databaseURL for Lapse.
//
// A lapse sets expires_at an hour into the past, not a second: PostgreSQL's
// now() is the time its transaction began, and a transaction of the
// schedule that began before the lapse must see the hold lapsed at its next
// statement too, or the same schedule would answer differently on a slower
// run. That a transaction begun before the lapse could still pay in real
// life (its clock reads the past) is the schedule in which its statement
// came before the lapse, which is explored as well.
func OpenClock(ctx context.Context, databaseURL string) (*Clock, error) {
	engine, err := dbstore.Engine(databaseURL)
	if err != nil {
		return nil, err
	}
	if engine == "postgres" {
		conn, err := pgx.Connect(ctx, databaseURL)
		if err != nil {
			return nil, fmt.Errorf("clock: connect: %w", err)
		}
		return &Clock{
			session: int64(conn.PgConn().PID()),
			close:   func() { _ = conn.Close(context.Background()) },
			lapse: func(ctx context.Context, id string) error {
				_, err := conn.Exec(ctx, `UPDATE orders SET expires_at = now() - interval '1 hour' WHERE id = $1`, id)
				return err
			},
		}, nil
	}
	db, err := openMySQL(databaseURL)
	if err != nil {
		return nil, err
	}
	// One pinned connection: its thread id is the session the scheduler
	// asks about.
	conn, err := db.Conn(ctx)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("clock: connect: %w", err)
	}
	c := &Clock{
		close: func() { _ = conn.Close(); _ = db.Close() },
		lapse: func(ctx context.Context, id string) error {
			_, err := conn.ExecContext(ctx, `UPDATE orders SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 HOUR WHERE id = ?`, id)
			return err
		},
	}
	if err := conn.QueryRowContext(ctx, `SELECT CONNECTION_ID()`).Scan(&c.session); err != nil {
		c.Close()
		return nil, fmt.Errorf("clock: read the session id: %w", err)
	}
	return c, nil
}

// Lapse ends the hold of order id now, by the database's clock.
func (c *Clock) Lapse(ctx context.Context, orderID string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.lapse(ctx, orderID); err != nil {
		return fmt.Errorf("clock: lapse the hold of %s: %w", orderID, err)
	}
	return nil
}

// Close ends the clock's connection.
func (c *Clock) Close() { c.close() }
