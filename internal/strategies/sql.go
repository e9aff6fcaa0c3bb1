package strategies

import (
	"context"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
)

// rowEntry is the entry of a SQL row strategy (info): built by build from
// the configuration, by byDefault with its default options (Entry.New).
func rowEntry(info Info, settings []string, gated bool, build func(Config) inventory.Strategic, byDefault func() inventory.Strategic) Entry {
	return Entry{Info: info, Settings: settings, Build: buildRow(build, gated), New: byDefault}
}

// buildRow builds a SQL row strategy: newStrategy's, behind the admission
// when ADMISSION_LIMIT is set, behind the row gate (ROW_MAX_IN_FLIGHT)
// when gated. The strategies that queue on the row hold a pooled
// connection while they wait, and the gate keeps a flood on one SKU from
// taking the whole pool; it goes in front of the admission, which then
// sees at most ROW_MAX_IN_FLIGHT of this instance's orders per SKU.
func buildRow(newStrategy func(Config) inventory.Strategic, gated bool) func(context.Context, Config, Deps) (inventory.Strategy, func(), error) {
	return func(ctx context.Context, cfg Config, deps Deps) (inventory.Strategy, func(), error) {
		s, stop := newStrategy(cfg).Strategy(), noStop
		if cfg.AdmissionLimit > 0 {
			var err error
			if s, stop, err = admit(ctx, cfg, s, deps.Log); err != nil {
				return inventory.Strategy{}, nil, err
			}
		}
		if !gated {
			return s, stop, nil
		}
		s, err := sqlrow.LimitRowWork(s, cfg.RowMaxInFlight)
		if err != nil {
			stop()
			return inventory.Strategy{}, nil, err
		}
		return s, stop, nil
	}
}

// batchedEntry is the group commit's entry. No ROW_MAX_IN_FLIGHT: one
// transaction per SKU at a time in this process is its own bound.
func batchedEntry(info Info) Entry {
	return Entry{Info: info, Settings: []string{"BATCH_MAX", "BATCH_WAIT", "BATCH_LANES", "FENCING=on"}, Build: func(_ context.Context, cfg Config, deps Deps) (inventory.Strategy, func(), error) {
		b := batched.New(deps.DB, batched.WithMax(cfg.BatchMax), batched.WithWait(cfg.BatchWait), batched.WithLanes(batchLanes(cfg)),
			batched.WithLogger(deps.Log), batched.WithObserver(deps.Metrics))
		return b.Strategy(), noStop, nil
	}}
}

// LanesByEngine is BATCH_LANES left unset: the lanes that sold the most
// on the engine (batchLanes).
const LanesByEngine = -1

// batchLanes is cfg's BATCH_LANES, or, when unset, the engine's: in the
// demo's catalog (10,000 SKUs, three instances, 2 cores, 2026-12-06, one
// run each) PostgreSQL sold 3,983 orders/s with one lane (batched's
// default, the biggest batches) and 3,064 with two, while MariaDB sold
// 2,594 with one and 3,461 with two (3,430 with four): its batches'
// transactions take longer, and two side by side keep it busy.
func batchLanes(cfg Config) int {
	if cfg.BatchLanes != LanesByEngine {
		return cfg.BatchLanes
	}
	if engine, err := store.Engine(cfg.DatabaseURL); err == nil && engine == "mysql" {
		return 2
	}
	// PostgreSQL, or a store given without its URL (a test's).
	return batched.DefaultLanes
}
