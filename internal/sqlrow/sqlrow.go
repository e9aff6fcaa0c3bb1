// Package sqlrow holds the SQL row strategies: one order, one transaction,
// guarded by the SQL on the SKU's stock row itself (naive, the control
// without a guard; for-update; version-cas; conditional), and the gates a
// row strategy can stand behind (LimitRowWork, AdmitThrough).
package sqlrow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flashsale/stock/internal/backoff"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/keygate"
)

// Names of the strategies, as STRATEGY spells them.
const (
	NameNaive       = "naive"
	NameForUpdate   = "for-update"
	NameVersionCAS  = "version-cas"
	NameConditional = "conditional"
)

// soldOutOrUnknown tells why a conditional write touched no row: the SKU does
// not exist, its window is not open, or too little stock was left.
func soldOutOrUnknown(ctx context.Context, tx inventory.StockTx, sku string) error {
	level, err := tx.ReadLevel(ctx, sku)
	if err != nil {
		return err
	}
	if err := level.Refusal(0); err != nil {
		return err
	}
	return inventory.ErrSoldOut
}

// readAvailable reads sku's level and fails with ErrSoldOut when fewer than
// quantity units are left, or with the window's error when the sale is not
// open: the read and check of every read-check-write strategy (the level is
// returned in every case).
func readAvailable(ctx context.Context, tx inventory.StockTx, sku string, quantity int64) (inventory.Level, error) {
	level, err := tx.ReadLevel(ctx, sku)
	if err == nil {
		err = level.Refusal(quantity)
	}
	return level, err
}

// Naive reads, checks and writes with no lock: between its read and its write
// another order can take the same units, so it oversells under concurrency.
// It is the control that shows what the other strategies prevent.
type Naive struct {
	raceWindow time.Duration
}

// NaiveOption configures Naive.
type NaiveOption func(*Naive)

// WithRaceWindow makes Naive wait d between its read and its write, which
// makes its race visible on demand in tests and demos. Default 0: no wait.
func WithRaceWindow(d time.Duration) NaiveOption {
	return func(n *Naive) { n.raceWindow = d }
}

// NewNaive returns the unsafe control strategy.
func NewNaive(opts ...NaiveOption) *Naive {
	n := &Naive{}
	for _, o := range opts {
		o(n)
	}
	return n
}

// Strategy implements Strategic.
func (n *Naive) Strategy() inventory.Strategy {
	return inventory.Strategy{Name: NameNaive, Deduct: n.Deduct}
}

// Deduct implements Strategy, unsafely.
func (n *Naive) Deduct(ctx context.Context, sku string, quantity int64, inTx inventory.TxRunner) error {
	return inTx(ctx, func(ctx context.Context, tx inventory.StockTx) error {
		if _, err := readAvailable(ctx, tx, sku, quantity); err != nil {
			return err
		}
		if err := inventory.Pause(ctx, n.raceWindow); err != nil {
			return err
		}
		return tx.Deduct(ctx, sku, quantity)
	})
}

// ForUpdate locks the stock row with SELECT … FOR UPDATE, checks, and writes:
// pessimistic, every order on a SKU waits for the one before it to commit.
type ForUpdate struct{}

// NewForUpdate returns the SELECT … FOR UPDATE strategy.
func NewForUpdate() *ForUpdate { return &ForUpdate{} }

// Strategy implements Strategic.
func (f *ForUpdate) Strategy() inventory.Strategy {
	return inventory.Strategy{Name: NameForUpdate, Deduct: f.Deduct}
}

// Deduct implements Strategy.
func (*ForUpdate) Deduct(ctx context.Context, sku string, quantity int64, inTx inventory.TxRunner) error {
	return inTx(ctx, func(ctx context.Context, tx inventory.StockTx) error {
		level, err := tx.LockLevel(ctx, sku)
		if err != nil {
			return err
		}
		if err := level.Refusal(quantity); err != nil {
			return err
		}
		return tx.Deduct(ctx, sku, quantity)
	})
}

// Conditional lets the database check and write in one statement,
// UPDATE … WHERE available >= quantity: no read, no retry, the row is locked
// only for the statement and the commit.
type Conditional struct{}

// NewConditional returns the conditional-UPDATE strategy.
func NewConditional() *Conditional { return &Conditional{} }

// Strategy implements Strategic.
func (c *Conditional) Strategy() inventory.Strategy {
	return inventory.Strategy{Name: NameConditional, Deduct: c.Deduct}
}

// Deduct implements Strategy.
func (*Conditional) Deduct(ctx context.Context, sku string, quantity int64, inTx inventory.TxRunner) error {
	return inTx(ctx, func(ctx context.Context, tx inventory.StockTx) error {
		ok, err := tx.DeductIfAvailable(ctx, sku, quantity)
		if err != nil {
			return err
		}
		if !ok {
			return soldOutOrUnknown(ctx, tx, sku)
		}
		return nil
	})
}

// VersionCAS reads the row and its version, then writes only if the version is
// unchanged; a lost race re-reads and tries again after a jittered backoff.
// Optimistic: no lock is held while the order is decided, but under
// contention most attempts lose, which is why each process lets only a few
// attempts on one SKU run at once (WithMaxInFlight).
type VersionCAS struct {
	maxAttempts int
	backoffBase time.Duration
	backoffMax  time.Duration
	inFlight    int
	gate        *keygate.Gate // nil: attempts not bounded
}

// CASOption configures VersionCAS.
type CASOption func(*VersionCAS)

// WithMaxAttempts bounds the compare-and-set attempts of one order; when they
// are spent the order fails with ErrBusy. Default 50. The order's deadline
// bounds them too.
func WithMaxAttempts(n int) CASOption {
	return func(v *VersionCAS) { v.maxAttempts = max(1, n) }
}

// WithBackoff sets the wait after a lost race: a random duration up to
// base·2^attempt, capped at maxWait ("full jitter", so that losers do not
// collide again in step). Default 1ms and 25ms.
func WithBackoff(base, maxWait time.Duration) CASOption {
	return func(v *VersionCAS) { v.backoffBase, v.backoffMax = base, maxWait }
}

// WithMaxInFlight bounds how many compare-and-set attempts one process runs
// at once on one SKU; the others wait in the process, holding no connection,
// until a slot frees or their deadline passes. Default 2; 0 means no bound.
//
// Why: on one hot row only one attempt per version can win, so every
// attempt beyond the first that runs at the same time is a certain loss that
// still costs a transaction, a pooled connection and, on InnoDB, a place in
// the row's lock queue. BenchmarkCASBurst (3 instances of 10 connections,
// 2,000 orders for 500 units, one run on 2 cores): on MariaDB no bound cost
// about 16,300 transactions and 8.6–9.1 s per burst, a bound of 2 about
// 4,200 and 2.2 s; on PostgreSQL 4,600–5,000 and 2.2–2.3 s against 3,800
// and 1.4–1.5 s. The bound is per process, so instances still race each
// other optimistically: it thins the race, it does not serialise it.
func WithMaxInFlight(n int) CASOption {
	return func(v *VersionCAS) { v.inFlight = max(0, n) }
}

// NewVersionCAS returns the version compare-and-set strategy.
func NewVersionCAS(opts ...CASOption) *VersionCAS {
	v := &VersionCAS{maxAttempts: 50, backoffBase: time.Millisecond, backoffMax: 25 * time.Millisecond, inFlight: 2}
	for _, o := range opts {
		o(v)
	}
	if v.inFlight > 0 {
		v.gate = keygate.New(v.inFlight)
	}
	return v
}

// Strategy implements Strategic.
func (v *VersionCAS) Strategy() inventory.Strategy {
	return inventory.Strategy{Name: NameVersionCAS, Deduct: v.Deduct}
}

// Deduct implements Strategy.
func (v *VersionCAS) Deduct(ctx context.Context, sku string, quantity int64, inTx inventory.TxRunner) error {
	for attempt := 0; ; attempt++ {
		err := v.try(ctx, sku, quantity, inTx)
		if !errors.Is(err, inventory.ErrVersionMoved) {
			return err
		}
		if attempt+1 >= v.maxAttempts {
			return fmt.Errorf("%w: %d compare-and-set attempts lost the race", inventory.ErrBusy, v.maxAttempts)
		}
		if err := inventory.Pause(ctx, backoff.Exponential(attempt, v.backoffBase, v.backoffMax)); err != nil {
			return err
		}
	}
}

// try makes one compare-and-set attempt, once the SKU's gate lets it in.
func (v *VersionCAS) try(ctx context.Context, sku string, quantity int64, inTx inventory.TxRunner) error {
	if v.gate != nil {
		leave, err := v.gate.Enter(ctx, sku)
		if err != nil {
			return fmt.Errorf("%w: waiting for a compare-and-set slot: %w", inventory.ErrBusy, err)
		}
		defer leave()
	}
	return inTx(ctx, func(ctx context.Context, tx inventory.StockTx) error {
		level, err := readAvailable(ctx, tx, sku, quantity)
		if err != nil {
			return err
		}
		ok, err := tx.DeductIfVersion(ctx, sku, quantity, level.Version)
		if err != nil {
			return err
		}
		if !ok {
			return inventory.ErrVersionMoved
		}
		return nil
	})
}
