// Package hotrow measures a database's hot-row ceiling: how many orders per
// second it takes on one stock row without the service in front of it.
//
// It runs the very statements of the strategies, through the same store
// adapters (internal/postgres, internal/mysql) and so the same SQL, driver
// and pool, from as many connections as the service's instances open
// together. What the service then reaches through HTTP is judged against
// this number: the gap is the cost of everything that is not the row lock.
package hotrow

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/flashsale/stock/internal/inventory"
)

// Store is what a measurement needs from a database.
type Store interface {
	InTx(ctx context.Context, fn func(ctx context.Context, tx inventory.Tx) error) error
	StartSale(ctx context.Context, sku string, n int64) error
}

// Statement is one way to take one unit from the row and record the order,
// in one transaction.
type Statement struct {
	// Name identifies the statement in reports: "conditional" or "for-update".
	Name string
	// SQL describes the transaction for a reader.
	SQL string
	// deduct runs inside the transaction, before the order insert.
	deduct func(ctx context.Context, tx inventory.Tx, sku string) error
}

// Conditional is the conditional-UPDATE strategy's transaction.
var Conditional = Statement{
	Name: "conditional",
	SQL:  "BEGIN; UPDATE stock SET available = available - 1, version = version + 1 WHERE sku = ? AND available >= 1; INSERT INTO orders …; COMMIT",
	deduct: func(ctx context.Context, tx inventory.Tx, sku string) error {
		ok, err := tx.DeductIfAvailable(ctx, sku, 1)
		if err == nil && !ok {
			err = errSoldOut
		}
		return err
	},
}

// ForUpdate is the SELECT … FOR UPDATE strategy's transaction.
var ForUpdate = Statement{
	Name: "for-update",
	SQL:  "BEGIN; SELECT available, version, fence FROM stock WHERE sku = ? FOR UPDATE; UPDATE stock SET available = available - 1, version = version + 1 WHERE sku = ?; INSERT INTO orders …; COMMIT",
	deduct: func(ctx context.Context, tx inventory.Tx, sku string) error {
		level, err := tx.LockLevel(ctx, sku)
		if err != nil {
			return err
		}
		if level.Available < 1 {
			return errSoldOut
		}
		return tx.Deduct(ctx, sku, 1)
	},
}

// Statements lists the statements a ceiling is measured for.
var Statements = []Statement{Conditional, ForUpdate}

// errSoldOut: the row ran dry, which a measurement must never let happen
// (it starts with inventory.MaxInitialStock units).
var errSoldOut = errors.New("hotrow: the row ran out of stock during the measurement")

// Result is one measurement.
type Result struct {
	Statement string        `json:"statement"`
	SQL       string        `json:"sql"`
	Workers   int           `json:"workers"`
	Duration  time.Duration `json:"duration_ns"`
	// Committed transactions, one order each.
	Committed int64 `json:"committed"`
	// Failed transactions (conflicts, timeouts); none is retried.
	Failed int64 `json:"failed"`
	// PerSecond is Committed divided by the measured time.
	PerSecond float64 `json:"per_second"`
	// Transaction latency percentiles.
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	// FirstError is the first failure seen, if any, for the report.
	FirstError string `json:"first_error,omitempty"`
}

type config struct {
	workers  int
	duration time.Duration
	keep     bool
}

// Option configures Measure.
type Option func(*config)

// WithWorkers sets how many connections run transactions at once; the
// store's pool must have at least that many. Default 48: three instances of
// the service with DB_MAX_CONNS=16.
func WithWorkers(n int) Option {
	return func(c *config) { c.workers = max(1, n) }
}

// WithDuration sets how long transactions are started. Default 5s.
func WithDuration(d time.Duration) Option {
	return func(c *config) { c.duration = d }
}

// WithKeepOrders leaves the measurement's SKU and its orders in the
// database. Default false: they are deleted afterwards (StartSale with 0
// units), since they prove nothing and only grow the orders table.
func WithKeepOrders(keep bool) Option {
	return func(c *config) { c.keep = keep }
}

// Measure puts inventory.MaxInitialStock units of sku on sale and runs stmt
// from the configured number of workers for the configured duration. The
// SKU should be unique to the measurement: its orders are deleted at the
// end.
func Measure(ctx context.Context, st Store, stmt Statement, sku string, opts ...Option) (Result, error) {
	cfg := config{workers: 48, duration: 5 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	res := Result{Statement: stmt.Name, SQL: stmt.SQL, Workers: cfg.workers}
	if err := st.StartSale(ctx, sku, inventory.MaxInitialStock); err != nil {
		return res, fmt.Errorf("hotrow: starting the sale of %s: %w", sku, err)
	}
	if !cfg.keep {
		defer func() {
			cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			_ = st.StartSale(cleanup, sku, 0)
		}()
	}

	// Workers stop starting transactions at the deadline, but the one in
	// flight runs to its end: cutting it off mid-commit would count work
	// the database did as a failure.
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	deadline := time.Now().Add(cfg.duration)

	type tally struct {
		committed, failed int64
		latencies         []time.Duration
		firstErr          error
	}
	tallies := make([]tally, cfg.workers)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range cfg.workers {
		wg.Go(func() {
			t := &tallies[w]
			for time.Now().Before(deadline) && runCtx.Err() == nil {
				began := time.Now()
				order := inventory.Order{
					ID: uuid.Must(uuid.NewV7()).String(), SKU: sku, Quantity: 1,
					UserID: "hotrow", Strategy: "hotrow-" + stmt.Name,
				}
				err := st.InTx(runCtx, func(ctx context.Context, tx inventory.Tx) error {
					if err := stmt.deduct(ctx, tx, sku); err != nil {
						return err
					}
					_, err := tx.InsertOrder(ctx, order)
					return err
				})
				if err != nil {
					t.failed++
					if t.firstErr == nil {
						t.firstErr = err
					}
					if errors.Is(err, errSoldOut) {
						cancel()
					}
					continue
				}
				t.committed++
				t.latencies = append(t.latencies, time.Since(began))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)

	var all []time.Duration
	for _, t := range tallies {
		res.Committed += t.committed
		res.Failed += t.failed
		all = append(all, t.latencies...)
		if t.firstErr != nil && res.FirstError == "" {
			res.FirstError = t.firstErr.Error()
		}
	}
	res.Duration = elapsed
	if elapsed > 0 {
		res.PerSecond = float64(res.Committed) / elapsed.Seconds()
	}
	slices.Sort(all)
	res.P50, res.P99 = percentile(all, 0.50), percentile(all, 0.99)
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("hotrow: %s interrupted: %w", stmt.Name, err)
	}
	if res.Committed == 0 {
		return res, fmt.Errorf("hotrow: no %s transaction committed: %s", stmt.Name, res.FirstError)
	}
	return res, nil
}

// percentile of sorted durations, nearest rank.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
