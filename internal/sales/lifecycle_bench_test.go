package sales_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testdb"
)

// BenchmarkLifecycleBurst: what holds and a per-user limit cost an order on
// a hot row. 64 buyers place one-unit orders on one SKU through one service
// (a pool of 16 connections, no HTTP), each buyer a new user_id, with the
// lifecycle off (HOLD_TTL=0, no limit) and on (HOLD_TTL=15m,
// PER_USER_LIMIT=1: the buyer's row claimed before the deduction, the
// order written held). The stock never runs out. Each op is one order; run
// the modes alternately and compare orders/s in the same run:
//
//	go test -run '^$' -bench LifecycleBurst -benchtime 3000x -count 5 ./internal/sales/
func BenchmarkLifecycleBurst(b *testing.B) {
	for _, engine := range store.Engines {
		for _, name := range []string{strategies.NameBatched, strategies.NameConditional, strategies.NameForUpdate} {
			for _, mode := range []string{"off", "on"} {
				b.Run(fmt.Sprintf("%s/%s/lifecycle=%s", engine, name, mode), func(b *testing.B) {
					ctx := context.Background()
					db := testdb.New(b, engine, 16)
					// Built as the service builds it: the row strategies
					// behind the row gate (ROW_MAX_IN_FLIGHT=4).
					cfg := strategies.Defaults()
					cfg.Strategy = name
					strategy, stop, err := strategies.Build(ctx, cfg, strategies.Deps{DB: db})
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(stop)
					opts := []sales.ServiceOption{sales.WithOrderTimeout(30 * time.Second)}
					if mode == "on" {
						opts = append(opts, sales.WithHoldTTL(15*time.Minute), sales.WithPerUserLimit(1))
					}
					svc := sales.NewService(db, strategy, opts...)
					if err := svc.StartSale(ctx, "hot", inventory.MaxInitialStock); err != nil {
						b.Fatal(err)
					}
					burstOnHotRow(b, svc, 64)
				})
			}
		}
	}
}
