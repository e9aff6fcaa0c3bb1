package inventory

import (
	"errors"
	"time"
)

// The states of an order. With a hold (WithHoldTTL) a new order is held
// until it is paid, cancelled or its hold lapses:
//
//	held ──pay──▶ paid
//	  ├──cancel──▶ cancelled   (units returned)
//	  └──expiry (sweep or lazy)──▶ expired   (units returned)
//
// Without one it is final at once and never changes.
const (
	// OrderFinal: sold, and nothing changes it (HOLD_TTL=0).
	OrderFinal     = "final"
	OrderHeld      = "held"
	OrderPaid      = "paid"
	OrderCancelled = "cancelled"
	OrderExpired   = "expired"
)

// Errors of a transition the order's state does not allow. Each says what
// the order is now, so the buyer learns which of a racing pay and expiry
// won.
var (
	ErrOrderPaid      = errors.New("order already paid")
	ErrOrderCancelled = errors.New("order cancelled")
	ErrOrderExpired   = errors.New("order expired: its hold lapsed and the units went back on sale")
	ErrOrderFinal     = errors.New("order is final: it was placed without a hold (HOLD_TTL=0), so it can be neither paid nor cancelled")
)

// Order is one accepted purchase: the proof that Quantity units of SKU were
// deducted (and, once it is cancelled or expired, that they came back).
type Order struct {
	ID       string
	SKU      string
	Quantity int64
	UserID   string
	Strategy string
	// State is OrderFinal when orders are final at once (HOLD_TTL=0);
	// otherwise OrderHeld until it is paid, cancelled or expires.
	State string
	// ExpiresAt is when a held order lapses, on the database's clock; zero
	// for a final order (and on a new order's answer: the database sets it).
	ExpiresAt time.Time
	// Hold, on a new order only, is how long its units are held for
	// payment: the store sets expires_at to the database's now() + Hold.
	Hold time.Duration
	// Lapsed, on an order read from the store, says that it was held and
	// its hold had run out by the database's clock at the read.
	Lapsed bool
	// Claimed is the units the order added to its buyer's count
	// (PER_USER_LIMIT): what its cancel or expiry gives back to that
	// count. 0 for an order taken without a limit, which counts nothing
	// and gives nothing back, so a count never falls below what the
	// buyer's counted orders hold whatever limit each instance runs with.
	Claimed int64
}

// OrderPage is a page of a buyer's orders; Next, when not "", is the
// after of the next page.
type OrderPage struct {
	Orders []Order
	Next   string
}

// UnknownCommitBudget is how long the lookup that resolves a commit whose
// answer was lost may take, of its own: not what is left of the request's
// deadline, which the lost answer has often spent. Within it the lookup
// is tried again while the database does not answer.
const UnknownCommitBudget = 10 * time.Second
