package inventory

import (
	"context"
	"errors"
	"fmt"
)

// TxRunner runs deduct in the transaction of one order. When deduct returns
// nil, the runner records the order in that same transaction and commits, so
// a sold unit is always an order row. A strategy may call it more than once
// (each call is a new transaction) and may hold something around it, such as
// a lock.
type TxRunner func(ctx context.Context, deduct func(ctx context.Context, tx StockTx) error) error

// Strategy is the strategy contract: what a Service needs of a strategy,
// in one struct. A strategy either deducts inside the order's transaction
// that the Service runs (Deduct) or takes whole orders itself (TakeOrder);
// every other field is a capability, nil when the strategy has none, and
// the Service then does without it (the database's level, audit and sale
// start). One struct of funcs, not optional interfaces found by type
// assertion: a wrapper (LimitRowWork, AdmitThrough) copies it and replaces
// Deduct, so it cannot drop a capability by forgetting to forward it.
type Strategy struct {
	// Name is the strategy's STRATEGY value, recorded on every order.
	Name string
	// Deduct takes quantity units of sku through inTx. It returns
	// ErrSoldOut when fewer are available, and passes on the errors of
	// inTx that it does not handle itself.
	Deduct func(ctx context.Context, sku string, quantity int64, inTx TxRunner) error
	// TakeOrder takes a whole order instead (batched, the reservation
	// strategies): it checks the idempotency key, deducts, and records the
	// order, and returns the order recorded (o.Order, or for a replayed
	// key the first order of that key), or an error of this package.
	TakeOrder func(ctx context.Context, o PendingOrder) (Order, error)
	// StartSale and FinishStart keep the sale outside the database (the
	// reservation strategies): StartSale starts the sale st describes, in
	// the database (with st.Key) and in the strategy's own store;
	// FinishStart completes the start of sale number sale, which the
	// database recorded (a retry of a start with the same key), unless a
	// newer one was started since.
	StartSale   func(ctx context.Context, st SaleStart) error
	FinishStart func(ctx context.Context, st SaleStart, sale int64) error
	// StartCatalog and FinishCatalog are the same for a catalog's start
	// (many SKUs in one request): StartCatalog starts every sale of c;
	// FinishCatalog completes, for a retry with the same key, each start
	// of starts that the database recorded and still holds.
	StartCatalog  func(ctx context.Context, c CatalogStart) error
	FinishCatalog func(ctx context.Context, starts []SaleStart) error
	// ResetSKU clears what the strategy keeps per SKU (lock keys) for a
	// new sale.
	ResetSKU func(ctx context.Context, sku string) error
	// ResetSKUs is ResetSKU for many SKUs (a catalog's start), in fewer
	// round trips than one per SKU; nil: ResetSKU for each.
	ResetSKUs func(ctx context.Context, skus []string) error
	// RelayReturns gives back to the strategy's own store the returns the
	// database marked for it (Tx.MarkRelay) of skus, of every SKU when
	// skus is empty, and reports how many: the strategy counts the stock outside
	// the database. A cancel or an expiry is decided in the database as
	// for every strategy and marks the order in the same transaction; the
	// service relays right after the commit, and its sweep relays what a
	// process that died left marked.
	RelayReturns func(ctx context.Context, skus ...string) (int, error)
	// Audit and Level: a strategy that keeps its own books audits a SKU
	// and reports its stock itself.
	Audit func(ctx context.Context, sku string) (Audit, error)
	Level func(ctx context.Context, sku string) (Level, error)
	// Ping answers whether the strategy's own backends answer.
	Ping func(ctx context.Context) error
	// BuyerUnits reads the units each of userIDs holds or has paid for in
	// sku's sale, for a strategy that counts them outside the database
	// (the reservation strategies count them in Redis); nil: the
	// database's count (Store.BuyerUnits), which the order's transaction
	// claims (PER_USER_LIMIT).
	BuyerUnits func(ctx context.Context, sku string, userIDs []string) (map[string]int64, error)
}

// Strategy returns s itself: a Strategy is Strategic.
func (s Strategy) Strategy() Strategy { return s }

// Strategic is what a Service is built with: a Strategy, or a strategy's
// own type (a *Locked, a *batched.Batched, …), which hands out its
// Strategy.
type Strategic interface {
	Strategy() Strategy
}

// Validate reports what makes s no strategy: a name, and exactly one way
// of taking orders; a sale kept outside the database starts and finishes
// there.
func (s Strategy) Validate() error {
	var errs []error
	if s.Name == "" {
		errs = append(errs, errors.New("no name"))
	}
	if (s.Deduct == nil) == (s.TakeOrder == nil) {
		errs = append(errs, errors.New("exactly one of Deduct and TakeOrder"))
	}
	if own := s.StartSale != nil; own != (s.FinishStart != nil) || own != (s.StartCatalog != nil) || own != (s.FinishCatalog != nil) {
		errs = append(errs, errors.New("StartSale, FinishStart, StartCatalog and FinishCatalog together"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("inventory: strategy %q: %w", s.Name, err)
	}
	return nil
}

// PendingOrder is an order the Service has validated and named, handed to
// a strategy's TakeOrder to be taken.
type PendingOrder struct {
	// Order is the row to record if the order is taken: its ID, SKU,
	// quantity, buyer and strategy.
	Order Order
	// IdempotencyKey is the client's key, "" without one.
	IdempotencyKey string
	// Fingerprint identifies the request's body, to tell a retry of the
	// same request (replay the first order) from another request with the
	// same key (ErrIdempotencyConflict).
	Fingerprint []byte
	// PerUserLimit bounds the units the buyer may hold or have paid for in
	// the SKU's sale (0: none): the taker claims them (ClaimUnits) in the
	// transaction that deducts, or refuses with ErrLimitReached.
	PerUserLimit int64
	// Mark, when not nil, is this instance's sold-out mark, for a taker
	// whose order can wait its turn (a gate, a lost race's pause) before
	// a round trip: a refusal it gives then is the answer, returned as is
	// (ErrSoldOut, not the store's observation: it is never noted again).
	// Nil for an order the mark may not answer (one with a key, under a
	// limit, the probe that renews the mark).
	Mark SoldOutMark
}

// SoldOutMark is this instance's memory of the SKUs its store refused sold
// out a moment ago (WithSoldOutTTL).
type SoldOutMark interface {
	// Refusal is the sold-out answer to an order of quantity units of sku
	// that the mark refuses now without asking the store, nil when it
	// does not.
	Refusal(sku string, quantity int64) error
}
