package reservation_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/store"
)

// shardError is an error reply of the Redis server (go-redis's
// redis.Error), as a shard that cannot serve a key's slot answers
// (CLUSTERDOWN, TRYAGAIN): the script never ran.
type shardError string

func (e shardError) Error() string { return string(e) }
func (shardError) RedisError()     {}

// failSKUs fails every run of the return script (returns and restocks) of
// the SKUs it holds with a server error reply, and sends the others'.
type failSKUs struct {
	mu   sync.Mutex
	skus map[string]bool
}

func (h *failSKUs) set(sku string, failing bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.skus[sku] = failing
}

// failing reports whether cmd is a run of the return script (three keys,
// the first the sale's hash) of a SKU that fails.
func (h *failSKUs) failing(cmd redis.Cmder) bool {
	args := cmd.Args()
	if n := cmd.Name(); (n != "evalsha" && n != "eval") || len(args) < 6 {
		return false
	}
	sale, _ := args[3].(string)
	set, _ := args[4].(string)
	if !strings.HasSuffix(sale, "}:sale") || !(strings.HasSuffix(set, "}:returned") || strings.HasSuffix(set, "}:restocks")) {
		return false
	}
	sku := strings.TrimSuffix(strings.TrimPrefix(sale, "stock:{"), "}:sale")
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.skus[sku]
}

func (h *failSKUs) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *failSKUs) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.failing(cmd) {
			err := shardError("CLUSTERDOWN injected: the slot of this SKU is not served")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (h *failSKUs) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var send []redis.Cmder
		for _, cmd := range cmds {
			if h.failing(cmd) {
				cmd.SetErr(shardError("CLUSTERDOWN injected: the slot of this SKU is not served"))
				continue
			}
			send = append(send, cmd)
		}
		if len(send) == 0 {
			return nil
		}
		return next(ctx, send)
	}
}

// TestSweepRelaysARestockWhileAnotherSKUsReturnFails: the sweep relays
// what is left marked (relayAll) for many SKUs at once (relaySKUs). One
// SKU whose return Redis cannot take (its shard answers errors; the order
// stays marked, as it should) must hold up no other SKU: found by review,
// the relay stopped at the first failing SKU, before any SKU's restocks,
// and kept B's restock out of Redis for as long as A failed (the restock
// available in the database, never on sale in Redis, sweep after sweep).
// A failing SKU now leaves the relay and the others go on.
//
//	sales A (1 unit) and B (1 unit); order X of A, held and written
//	A's shard answers errors from now on: cancel X -> 200, X returned and marked, its relay fails
//	restock B +2 while B's shard blips: the restock is recorded and marked, its relay fails
//	B's shard answers again; sweeps: relayAll lists A and B; A's return fails, B's restock goes on
//	-> Redis sells 3 units of B, as the database says
func TestSweepRelaysARestockWhileAnotherSKUsReturnFails(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			forEachMode(t, func(t *testing.T, m mode) {
				s := newSaleIn(t, engine, m)
				s.holding(m)
				hook := &failSKUs{skus: map[string]bool{}}
				s.rdb.AddHook(hook)
				s.consume(s.db)
				ctx := context.Background()
				const a, b = "relay-fail-a", "relay-fail-b"
				s.start(a, 1)
				s.start(b, 1)
				x, err := s.order(a, 1, "x", "")
				if err != nil {
					t.Fatal(err)
				}
				s.drained(a, 1)

				hook.set(a, true) // from now on
				if _, err := s.svc.CancelOrder(ctx, x.ID, "x"); err != nil {
					t.Fatalf("cancel X: %v", err)
				}
				if db, err := s.db.Audit(ctx, a); err != nil || db.RelayingOrders != 1 {
					t.Fatalf("A after the cancel whose relay failed: %+v, %v; want X marked", db, err)
				}

				hook.set(b, true) // a blip during the restock's own relay
				if _, err := s.svc.Restock(ctx, b, 2); err != nil {
					t.Logf("restock of B while its shard blips: %v", err)
				}
				hook.set(b, false)
				if db, err := s.db.Audit(ctx, b); err != nil || db.Relaying != 2 || db.Available != 3 {
					t.Fatalf("B after the restock whose relay failed: %+v, %v; want 3 available, the restock of 2 marked", db, err)
				}

				for i := range 3 {
					if _, err := s.svc.ExpireHolds(ctx, 0); err != nil {
						t.Logf("sweep %d: %v", i+1, err)
					}
				}
				db, err := s.db.Audit(ctx, b)
				if err != nil {
					t.Fatal(err)
				}
				tally, err := s.res.Tally(ctx, b)
				if err != nil {
					t.Fatal(err)
				}
				if db.Relaying != 0 || tally.Restocked != 2 || tally.Available != 3 {
					t.Errorf("after 3 sweeps, with only A's shard failing: B's restock is still marked (%d units) and Redis sells %d of B (restocked %d), the database has %d: A's failing return keeps every other SKU's restock out of Redis",
						db.Relaying, tally.Available, tally.Restocked, db.Available)
				}
				// A's return stays marked while its shard fails: not lost.
				if db, err := s.db.Audit(ctx, a); err != nil || db.RelayingOrders != 1 {
					t.Errorf("A after the sweeps: %+v, %v; want X still marked", db, err)
				}
			})
		})
	}
}
