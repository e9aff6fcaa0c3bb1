// Package sales runs a sale through one strategy: the Service places an
// order (validated, made idempotent, deducted by the strategy, recorded),
// pays, cancels and expires held ones, starts sales and restocks, and
// answers levels, audits and a buyer's orders. It decides what the domain
// (internal/inventory) rules; the strategy decides how stock is taken.
package sales

import (
	"context"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"github.com/flashsale/stock/internal/inventory"
)

// Service takes orders with one strategy over one store.
type Service struct {
	store      inventory.Store
	strategy   inventory.Strategy
	log        *slog.Logger
	timeout    time.Duration
	txAttempts int
	newID      func() string
	obs        inventory.Observer
	hold       time.Duration
	limit      int64
	// relay is the strategy's RelayReturns when it counts the stock
	// outside the database: returns are marked for it and relayed.
	relay func(ctx context.Context, skus ...string) (int, error)
	// soldOut refuses the orders of a SKU just refused sold out without
	// a round trip; nil when WithSoldOutTTL(0) turned it off.
	soldOut *soldOutMarks
	// buyers reads buyers' units for the mark's answers under a
	// per-buyer limit (nil without one).
	buyers     *buyerReads
	soldOutTTL time.Duration
	now        func() time.Time
}

// ServiceOption configures a Service.
type ServiceOption func(*Service)

// WithOrderTimeout bounds the time one order may take, waits included; past
// it the order fails with ErrBusy and nothing is deducted. Default 3s.
func WithOrderTimeout(d time.Duration) ServiceOption {
	return func(s *Service) { s.timeout = d }
}

// WithTxAttempts bounds how often one transaction is run again after the
// database aborted it to resolve a conflict (deadlock, serialisation
// failure, lock wait timeout). Default 5.
func WithTxAttempts(n int) ServiceOption {
	return func(s *Service) { s.txAttempts = max(1, n) }
}

// WithLogger sets the logger. Default: slog.Default().
func WithLogger(l *slog.Logger) ServiceOption {
	return func(s *Service) { s.log = l }
}

// WithObserver sets who hears about orders and retries. Default:
// NopObserver.
func WithObserver(o inventory.Observer) ServiceOption {
	return func(s *Service) { s.obs = o }
}

// WithHoldTTL makes every new order held for d, on the database's clock,
// until its buyer pays or cancels it (PayOrder, CancelOrder); a hold that
// lapses gives its units back (ExpireHolds, or lazily when the order is
// read). Default 0: orders are final at once.
func WithHoldTTL(d time.Duration) ServiceOption {
	return func(s *Service) { s.hold = max(0, d) }
}

// WithPerUserLimit bounds the units one buyer (user_id) holds or has paid
// for per SKU and sale to n, across instances and strategies: the order's
// transaction claims them on the buyer's row (ClaimUnits) before it
// deducts, so the check cannot come after the decrement, and an order past
// the limit is ErrLimitReached with nothing changed. Cancelled and expired
// orders give their units back to the buyer too. Every instance of a sale
// should run with the same limit. Default 0: no limit.
func WithPerUserLimit(n int64) ServiceOption {
	return func(s *Service) { s.limit = max(0, n) }
}

// WithSoldOutTTL sets how long an order refused sold out lets this instance
// refuse the SKU's orders of as many units or more without asking the
// store: once a sale's units are gone, most of its orders are answered so,
// and the cheapest answer should be the one given most. It is also the
// bound on how long this instance may answer sold out to an order that
// units given back through another instance (a cancel, an expiry, a
// restock, a new sale) would cover; those given back through this
// instance lift the mark at once. The mark only refuses, so no order is
// ever let through that the stock does not cover; an order with an
// idempotency key always asks (a retry of an order taken gets its order).
// Default DefaultSoldOutTTL (1s); 0 turns the mark off.
func WithSoldOutTTL(d time.Duration) ServiceOption {
	return func(s *Service) { s.soldOutTTL = max(0, d) }
}

// WithClock sets the clock the sold-out mark's time is read from (only
// durations on it count, never its hour). Default time.Now; tests and the
// schedule explorer step their own.
func WithClock(now func() time.Time) ServiceOption {
	return func(s *Service) { s.now = now }
}

// NewService returns a Service.
//
// It panics on a strategy that breaks the contract (Strategy.Validate): a
// programming error, caught where the strategy is wired.
func NewService(store inventory.Store, strategic inventory.Strategic, opts ...ServiceOption) *Service {
	strategy := strategic.Strategy()
	if err := strategy.Validate(); err != nil {
		panic(err)
	}
	s := &Service{
		store:      store,
		strategy:   strategy,
		log:        slog.Default(),
		timeout:    3 * time.Second,
		txAttempts: 5,
		newID:      newOrderID,
		obs:        inventory.NopObserver{},
		soldOutTTL: DefaultSoldOutTTL,
		now:        time.Now,
	}
	for _, o := range opts {
		o(s)
	}
	if s.soldOutTTL > 0 {
		s.soldOut = newSoldOutMarks(s.soldOutTTL, s.now)
		if s.limit > 0 {
			read := store.BuyerUnits
			if strategy.BuyerUnits != nil {
				read = strategy.BuyerUnits
			}
			s.buyers = newBuyerReads(read)
		}
	}
	s.relay = strategy.RelayReturns
	return s
}

// newOrderID returns a UUIDv7: time-ordered, so order inserts append to the
// primary key index instead of splitting random pages.
func newOrderID() string {
	return uuid.Must(uuid.NewV7()).String()
}

// Strategy returns the name of the service's strategy.
func (s *Service) Strategy() string { return s.strategy.Name }

// Level returns a SKU's stock.
func (s *Service) Level(ctx context.Context, sku string) (inventory.Level, error) {
	if err := inventory.ValidateSKU(sku); err != nil {
		return inventory.Level{}, err
	}
	if level := s.strategy.Level; level != nil {
		return level(ctx, sku)
	}
	return s.store.Level(ctx, sku)
}

// Audit returns the SKU's bookkeeping.
func (s *Service) Audit(ctx context.Context, sku string) (inventory.Audit, error) {
	if err := inventory.ValidateSKU(sku); err != nil {
		return inventory.Audit{}, err
	}
	if audit := s.strategy.Audit; audit != nil {
		return audit(ctx, sku)
	}
	return s.store.Audit(ctx, sku)
}

// Ready reports whether the database and the strategy's own backends answer.
func (s *Service) Ready(ctx context.Context) error {
	if err := s.store.Ping(ctx); err != nil {
		return err
	}
	if ping := s.strategy.Ping; ping != nil {
		return ping(ctx)
	}
	return nil
}
