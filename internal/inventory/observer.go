package inventory

import (
	"errors"
	"time"
)

// Observer hears what the service and its strategies do, for metrics. Its
// methods are called on the order's goroutine: they must be cheap and safe
// for concurrent use.
type Observer interface {
	// OrderDone reports one order's outcome (see Outcome) and how long it
	// took, waits included.
	OrderDone(strategy, outcome string, elapsed time.Duration)
	// Retried reports a transaction run again: "version_moved" (a lost
	// compare-and-set), "conflict" (deadlock, serialisation failure) or
	// "key_taken" (a concurrent request with the same idempotency key).
	Retried(strategy, reason string)
	// LockAcquired reports the wait for a lock; LockReleased how long it
	// was held and whether it had been lost meanwhile.
	LockAcquired(strategy string, waited time.Duration)
	LockReleased(strategy string, held time.Duration, lost bool)
	// FencedOff reports a write refused because a newer lock holder had
	// written the row: a holder that lost its lock without knowing.
	FencedOff(strategy string)
	// OrderSettled reports an order moved out of held by this instance:
	// to is OrderPaid, OrderCancelled or OrderExpired.
	OrderSettled(strategy, to string)
}

// NopObserver ignores everything.
type NopObserver struct{}

func (NopObserver) OrderDone(string, string, time.Duration)  {}
func (NopObserver) Retried(string, string)                   {}
func (NopObserver) LockAcquired(string, time.Duration)       {}
func (NopObserver) LockReleased(string, time.Duration, bool) {}
func (NopObserver) FencedOff(string)                         {}
func (NopObserver) OrderSettled(string, string)              {}

// Outcome names the result of an order for metrics and logs: "created",
// "sold_out", "limit_reached", "not_started", "ended", "unknown_sku",
// "invalid", "idempotency_conflict", "busy", "unavailable" or "error" (and,
// for pay and cancel, "order_not_found", "paid", "cancelled", "expired",
// "final").
func Outcome(err error) string {
	switch {
	case err == nil:
		return "created"
	case errors.Is(err, ErrSoldOut):
		return "sold_out"
	case errors.Is(err, ErrLimitReached):
		return "limit_reached"
	case errors.Is(err, ErrSaleNotStarted):
		return "not_started"
	case errors.Is(err, ErrSaleEnded):
		return "ended"
	case errors.Is(err, ErrUnknownSKU):
		return "unknown_sku"
	case errors.Is(err, ErrInvalid):
		return "invalid"
	case errors.Is(err, ErrIdempotencyConflict):
		return "idempotency_conflict"
	case errors.Is(err, ErrBusy):
		return "busy"
	case errors.Is(err, ErrUnavailable):
		return "unavailable"
	case errors.Is(err, ErrOrderNotFound):
		return "order_not_found"
	case errors.Is(err, ErrOrderPaid):
		return "paid"
	case errors.Is(err, ErrOrderCancelled):
		return "cancelled"
	case errors.Is(err, ErrOrderExpired):
		return "expired"
	case errors.Is(err, ErrOrderFinal):
		return "final"
	}
	return "error"
}
