package reservation_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/lab/testdb"
	"github.com/flashsale/stock/lab/testredis"
)

// TestRedisRestoredWhileRunningIsClosedByTheReconciler: an older copy of
// Redis's data is put back into the running server, without a restart and
// without a promotion, so its replication id stays the one every sale was
// checked under:
//
//   - RESTORE … REPLACE of the keys of a backup (DUMP), as online restore
//     and migration tools (redis-shake, RIOT, rdb-tools) do;
//   - DEBUG RELOAD NOSAVE of an older dump.rdb put in the data folder (with
//     enable-debug-command local).
//
// Neither changes master_replid, and neither drops the script cache (both
// checked on Redis 7.0.15), so the reserve script finds the sale checked
// and would sell units the database already holds as sold: 10 units of 5.
// Nothing in the server tells such a restore from normal operation, so it
// is caught by the reconciler, which finds the database ahead of Redis and
// has the sale checked, which closes it: an order after that is refused.
// (A restore must go through a restart, which the checks catch at the next
// order; docs/design/reservation-durability.md says so. Between an in-place restore and the
// reconciler's next page with the SKU, the sale can sell again.)
//
//	sale E, 5 units; a copy of the SKU's keys is taken (5 left, no order)
//	order A: 5 units, 201, written to the database (0 left)
//	the copy is put back into the running server: 5 left, replid unchanged
//	the reconciler audits the SKU: the database is ahead: a forced check closes the sale
//	order B: 5 units: 503
func TestRedisRestoredWhileRunningIsClosedByTheReconciler(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		t.Run("RESTORE", func(t *testing.T) {
			s := newSaleIn(t, "postgres", m)
			restoredWhileRunning(t, s, func(sku string) func() {
				return restoreKeys(t, s, sku)
			})
		})
		t.Run("DEBUG-RELOAD", func(t *testing.T) {
			s := newSaleOn(t, testredis.StartDurable(t, "--enable-debug-command", "local"), m)
			restoredWhileRunning(t, s, func(string) func() {
				ctx := context.Background()
				if err := s.rdb.Save(ctx).Err(); err != nil { // the backup: dump.rdb
					t.Fatal(err)
				}
				return func() {
					if err := s.rdb.Do(ctx, "DEBUG", "RELOAD", "NOSAVE").Err(); err != nil {
						t.Fatal(err)
					}
				}
			})
		})
	})
}

// restoredWhileRunning sells a 5-unit sale out after backup took a copy,
// puts the copy back while the server runs, and orders again.
func restoredWhileRunning(t *testing.T, s *sale, backup func(sku string) (restore func())) {
	const sku = "restored-online"
	ctx := context.Background()
	s.consume(s.db)
	s.start(sku, 5)
	restore := backup(sku)

	before := replID(t, s.rdb)
	a, err := s.order(sku, 5, "first", "")
	if err != nil {
		t.Fatal(err)
	}
	s.drained(sku, 1)

	restore()
	if after := replID(t, s.rdb); after != before {
		t.Logf("the replication id changed (%s -> %s)", before, after)
	}
	tally, _ := s.res.Tally(ctx, sku)
	t.Logf("Redis after the restore: %+v", tally)
	got := &reconciled{}
	rec := s.res.NewReconciler(reservation.NewReserved(s.res, s.db), slog.New(slog.DiscardHandler), got)
	if err := rec.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got.drifting != 1 {
		t.Fatalf("the reconciler found %d SKUs drifting after the restore, want 1", got.drifting)
	}

	b, err := s.order(sku, 5, "second", "")
	if err == nil {
		db := s.drained(sku, 2)
		t.Fatalf("order %s answered 201 after an older copy was restored into the running Redis (order %s had taken those 5 units); the database: %d orders for %d units of a %d-unit sale (available %d)",
			b.ID, a.ID, db.Orders, db.Ordered, db.Initial, db.Available)
	}
	if !errors.Is(err, reservation.ErrSaleNotLoaded) {
		t.Fatalf("after the restore: %v, want 503 (the sale closed)", err)
	}
}

// restoreKeys takes a copy of the SKU's keys (DUMP) and returns a function
// that puts it back into the running server (RESTORE … REPLACE; a key the
// copy did not have is deleted).
func restoreKeys(t *testing.T, s *sale, sku string) func() {
	t.Helper()
	ctx := context.Background()
	base := "stock:{" + sku + "}:"
	names := []string{base + "sale", base + "epoch", base + "keys", base + "orders", base + "buyers", base + "returned", base + "open", base + "restocks", catalogKey}
	dumps := map[string]string{}
	for _, k := range names {
		v, err := s.rdb.Dump(ctx, k).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		dumps[k] = v
	}
	return func() {
		for _, k := range names {
			v, ok := dumps[k]
			var err error
			if ok {
				err = s.rdb.RestoreReplace(ctx, k, 0, v).Err()
			} else {
				err = s.rdb.Del(ctx, k).Err()
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
}

// newSaleOn is newSaleIn over a Redis the caller started.
func newSaleOn(t *testing.T, srv *testredis.Server, m mode) *sale {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	db := testdb.New(t, "postgres", 8)
	res := reservation.New(rdb, db, m.opts...)
	return &sale{t: t, redis: srv, rdb: rdb, db: db, res: res,
		svc: sales.NewService(db, reservation.NewReserved(res, db, reservation.WithReservedName(m.name))), seen: newWritten()}
}

// replID reads the server's master_replid.
func replID(t *testing.T, rdb *redis.Client) string {
	t.Helper()
	info, err := rdb.Info(context.Background(), "replication").Result()
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(info, "master_replid:")
	if id, _, _ := strings.Cut(rest, "\r\n"); ok && id != "" {
		return id
	}
	t.Fatalf("no master_replid in %q", info)
	return ""
}
