package sales_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
)

// TestResolveOrderSeesTheCommitThatEndedItsWait: claim 2 at the engines.
// A writer transaction deducts (the stock row locked) and inserts an
// order; a ResolveOrder starts at a random moment around the writer's
// COMMIT, often while the COMMIT is on its way. Whenever the writer
// commits, ResolveOrder must find the order: its share lock waits for the
// writer, and the read after it (READ COMMITTED on PostgreSQL; on MariaDB
// the first consistent read, whose snapshot is taken after the lock was
// granted) sees the commit. Hundreds of rounds per engine, to catch a
// window between InnoDB's lock release and the commit's visibility.
func TestResolveOrderSeesTheCommitThatEndedItsWait(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, raw := dbWithRawAccess(t, engine, 8)
			svc := sales.NewService(db, sqlrow.NewConditional())
			if err := svc.StartSale(ctx, "vis", 1_000_000); err != nil {
				t.Fatal(err)
			}
			const rounds = 400
			missed := 0
			for i := range rounds {
				id := fmt.Sprintf("01930000-0000-7000-8000-%012d", i)
				found := make(chan error, 1)
				var begin, commit func() error
				switch engine {
				case "postgres":
					tx, err := raw.pg.Begin(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := tx.Exec(ctx, `UPDATE stock SET available = available - 1 WHERE sku = 'vis'`); err != nil {
						t.Fatal(err)
					}
					begin = func() error {
						_, err := tx.Exec(ctx, `INSERT INTO orders (id, sku, quantity, user_id, strategy) VALUES ($1, 'vis', 1, 'u', 'conditional')`, id)
						return err
					}
					commit = func() error { return tx.Commit(ctx) }
				default:
					tx, err := raw.my.BeginTx(ctx, nil)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := tx.Exec(`UPDATE stock SET available = available - 1 WHERE sku = 'vis'`); err != nil {
						t.Fatal(err)
					}
					begin = func() error {
						_, err := tx.Exec(`INSERT INTO orders (id, sku, quantity, user_id, strategy) VALUES (?, 'vis', 1, 'u', 'conditional')`, id)
						return err
					}
					commit = tx.Commit
				}
				if err := begin(); err != nil {
					t.Fatal(err)
				}
				// Jitter without a clock: the lookup and the commit start
				// after a random number of yields each.
				spin := rand.IntN(200)
				go func() {
					for range spin {
						runtime.Gosched()
					}
					var ok bool
					err := db.InTx(ctx, func(ctx context.Context, tx inventory.Tx) (err error) {
						_, ok, err = tx.ResolveOrder(ctx, "vis", id)
						return err
					})
					if err == nil && !ok {
						err = fmt.Errorf("not found")
					}
					found <- err
				}()
				for range rand.IntN(200) {
					runtime.Gosched()
				}
				if err := commit(); err != nil {
					t.Fatal(err)
				}
				if err := <-found; err != nil {
					missed++
					t.Errorf("round %d: ResolveOrder around the writer's commit: %v", i, err)
				}
			}
			t.Logf("%d of %d rounds missed the commit", missed, rounds)
		})
	}
}
