package inventory

import "context"

// The strategy contract: what a Service needs of a strategy. Every strategy
// is a Strategy (a name, and a deduction inside the order's transaction);
// one that owns its orders' transactions or keeps its own books implements
// the capabilities below as well, and the Service uses each one it finds.
// A wrapper of a strategy (LimitRowWork, AdmitThrough) forwards every
// capability its inner strategy has or refuses that strategy when it is
// built, so no capability is lost to a wrapper.

// PendingOrder is an order the Service has validated and named, handed to
// an OrderTaker to be taken.
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

// OrderTaker is a strategy that takes whole orders instead of deducting in
// a transaction the Service runs (batched, the reservation strategies): it
// checks the idempotency key, deducts, and records the order, and returns
// the order recorded (o.Order, or for a replayed key the first order of
// that key), or an error of this package.
type OrderTaker interface {
	Strategy
	TakeOrder(ctx context.Context, o PendingOrder) (Order, error)
}

// SaleKeeper is a strategy that keeps the sale itself (the stock counted
// outside the database): it starts sales, with their windows, instead of
// the Service.
type SaleKeeper interface {
	// StartSaleWith starts the sale st describes, in the database (with
	// st.Key) and in the strategy's own store.
	StartSaleWith(ctx context.Context, st SaleStart) error
	// FinishStart completes the start of sale number sale, which the
	// database recorded (a retry of a start with the same key): it makes
	// the strategy's own store hold that sale unless a newer one was
	// started since, and does nothing more when it holds it already.
	FinishStart(ctx context.Context, st SaleStart, sale int64) error
}

// ReturnRelay is a strategy that counts the stock outside the database
// (the reservation strategies). A cancel or an expiry is decided in the
// database as for every strategy (one conditional UPDATE, the database's
// clock), returns the units there, and marks the order (Tx.MarkRelay) in
// the same transaction; the strategy then gives the units back to its own
// store, once per order. The service relays right after the commit, and its
// sweep relays what a process that died left marked.
type ReturnRelay interface {
	// RelayReturns gives back the marked returns of sku (of every SKU when
	// sku is "") and reports how many.
	RelayReturns(ctx context.Context, sku string) (int, error)
}

// SKUStateResetter is a strategy that keeps state of its own per SKU (lock
// keys, fence counters) that a new sale must clear.
type SKUStateResetter interface {
	ResetSKU(ctx context.Context, sku string) error
}

// Auditor is a strategy that keeps its own books and audits a SKU itself.
type Auditor interface {
	Audit(ctx context.Context, sku string) (Audit, error)
}

// Leveler is a strategy that reports a SKU's stock itself.
type Leveler interface {
	Level(ctx context.Context, sku string) (Level, error)
}

// Pinger is a strategy (or an admission) that depends on a backend of its
// own, and answers whether it is ready.
type Pinger interface {
	Ping(ctx context.Context) error
}
