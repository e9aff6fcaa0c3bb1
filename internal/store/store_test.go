package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testdb"
)

func TestEngine(t *testing.T) {
	for url, want := range map[string]string{
		"postgres://u@h/db":      "postgres",
		"postgresql://u@h:5/db":  "postgres",
		"mysql://root@h:3306/db": "mysql",
		"sqlite:///tmp/stock.db": "",
		"127.0.0.1:5432/stock":   "",
		"://":                    "",
	} {
		got, err := store.Engine(url)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("Engine(%q) = %q, %v; want %q", url, got, err, want)
		}
	}
}

// TestDeadlockIsAConflict provokes a real deadlock on each engine: two
// transactions lock two rows in opposite orders. The database aborts one,
// and the adapter must report it as inventory.ErrConflict (which the service
// retries), never as an unexplained error.
func TestDeadlockIsAConflict(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, engine, 4)
			ctx := context.Background()
			for _, sku := range []string{"a", "b"} {
				if err := db.StartSale(ctx, sku, 10); err != nil {
					t.Fatal(err)
				}
			}
			locked := map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{})}
			errs := make(chan error, 2)
			for _, order := range [][2]string{{"a", "b"}, {"b", "a"}} {
				go func() {
					errs <- db.InTx(ctx, func(ctx context.Context, tx inventory.Tx) error {
						if _, err := tx.LockLevel(ctx, order[0]); err != nil {
							return err
						}
						close(locked[order[0]])
						<-locked[order[1]]
						_, err := tx.LockLevel(ctx, order[1])
						return err
					})
				}()
			}
			first, second := <-errs, <-errs
			var conflicts int
			for _, err := range []error{first, second} {
				switch {
				case err == nil:
				case errors.Is(err, inventory.ErrConflict):
					conflicts++
				default:
					t.Errorf("deadlock reported as %v, want inventory.ErrConflict", err)
				}
			}
			if conflicts != 1 {
				t.Errorf("%d conflicts (%v, %v), want exactly one victim", conflicts, first, second)
			}
		})
	}
}

// TestStuckTransactionTimeout: a transaction whose client stopped moving
// while it holds the stock row does not block the others for longer than
// the configured timeout.
func TestStuckTransactionTimeout(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			url := testdb.URL(t, engine)
			ctx := context.Background()
			db, err := store.Open(ctx, url, 4, store.WithStuckTransactionTimeout(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(db.Close)
			if err := db.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if err := db.StartSale(ctx, "s-1", 5); err != nil {
				t.Fatal(err)
			}
			locked, release := make(chan struct{}), make(chan struct{})
			stuck := make(chan error, 1)
			go func() {
				stuck <- db.InTx(ctx, func(ctx context.Context, tx inventory.Tx) error {
					if _, err := tx.LockLevel(ctx, "s-1"); err != nil {
						return err
					}
					close(locked)
					<-release // a frozen client: it holds the row and does nothing
					return tx.Deduct(ctx, "s-1", 1)
				})
			}()
			<-locked
			began := time.Now()
			err = db.InTx(ctx, func(ctx context.Context, tx inventory.Tx) error {
				return tx.Deduct(ctx, "s-1", 1)
			})
			waited := time.Since(began)
			close(release)
			stuckErr := <-stuck
			t.Logf("the other order waited %v: %v; the stuck one: %v", waited.Round(time.Millisecond), err, stuckErr)
			switch engine {
			case "postgres":
				// The server ended the stuck session: the other order went
				// through, and the stuck one cannot commit.
				if err != nil {
					t.Errorf("the other order failed: %v", err)
				}
				if !errors.Is(stuckErr, inventory.ErrUnavailable) {
					t.Errorf("the stuck transaction: %v, want unavailable (its session was ended)", stuckErr)
				}
			case "mysql":
				// The waiter gave up after the lock wait timeout: busy,
				// not retried (it would only wait again).
				if !errors.Is(err, inventory.ErrBusy) {
					t.Errorf("the waiting order: %v, want busy", err)
				}
			}
			if waited > 10*time.Second {
				t.Errorf("blocked %v behind a stuck transaction", waited)
			}
		})
	}
}
