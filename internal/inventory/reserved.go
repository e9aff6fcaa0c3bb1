package inventory

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Names of the strategies that count stock in Redis: redis-reserve takes an
// order with one atomic script, redis-watch with WATCH, a read, a check and
// MULTI/EXEC (Redis's textbook optimistic transaction). Both keep the same keys,
// so instances of both may share a sale.
const (
	NameRedisReserve = "redis-reserve"
	NameRedisWatch   = "redis-watch"
)

var (
	// ErrSaleNotLoaded: the reservation store has no sale for the SKU: it
	// was never loaded there, is being restarted, or the store lost its
	// data. Orders fail closed (503) until the sale is started again; it
	// wraps ErrUnavailable.
	ErrSaleNotLoaded = fmt.Errorf("%w: the sale is not loaded in the reservation store", ErrUnavailable)
	// ErrStaleSale: orders reserved in a sale of the SKU that has been
	// restarted since; the database refuses to write them into the new one.
	ErrStaleSale = errors.New("the orders belong to a sale that has been restarted")
)

// SaleNumberBehind: the reservation store has seen sale number Seen, at
// least the one a StartSale gave the database: the database's numbers are
// behind the store's (it was reset, or another database shares the store).
// StartSale starts the sale again above Seen.
type SaleNumberBehind struct{ Seen int64 }

func (e *SaleNumberBehind) Error() string {
	return fmt.Sprintf("the reservation store has seen sale number %d already", e.Seen)
}

// Reservation is one order as the reservation store takes it: the order
// (its id chosen before, so a retry of the same call is recognised), its
// idempotency key and request fingerprint, if it has a key, and the units
// one buyer may take in the sale (0: no limit).
type Reservation struct {
	Order        Order
	Key          string
	Fingerprint  []byte
	PerUserLimit int64
}

// Tally is the reservation store's bookkeeping of one SKU's sale.
type Tally struct {
	Epoch     int64
	Initial   int64
	Available int64
	// Ordered and Orders count every accepted order, in the database yet
	// or not.
	Ordered int64
	Orders  int64
	// Pending counts the accepted orders not yet written to the database;
	// Lag is the age of the oldest of them (0 when there is none).
	Pending int64
	Lag     time.Duration
}

// Reservations is a store outside the database (Redis) that counts a SKU's
// stock and accepts an order atomically with logging it durably; a
// consumer then writes the logged orders to the database.
type Reservations interface {
	// Reserve takes r.Order.Quantity units and logs r.Order, or refuses
	// with ErrSoldOut, ErrLimitReached (the buyer's units in the sale,
	// counted in the same atomic step as the stock, would pass
	// r.PerUserLimit), ErrIdempotencyConflict or ErrSaleNotLoaded. It
	// returns the id of the order that answers the request: r.Order.ID, or
	// the order an earlier request with the same key created. It returns
	// only once the order is durable.
	Reserve(ctx context.Context, r Reservation) (orderID string, err error)
	// Close stops the SKU's sale in the store, announcing sale epoch:
	// Reserve fails with ErrSaleNotLoaded until Load, and no sale older
	// than epoch can be loaded any more. A *SaleNumberBehind error means
	// the store has seen epoch or a later number already (a database that
	// was reset, or another database on the same store).
	Close(ctx context.Context, sku string, epoch int64) error
	// Load opens sale epoch of the SKU with n units and window w,
	// forgetting the keys, buyers' counts and unwritten orders of earlier
	// sales. It refuses an epoch lower than one closed or loaded already;
	// loading the open sale again changes nothing. Outside w, Reserve
	// refuses with ErrSaleNotStarted or ErrSaleEnded on the store's clock.
	Load(ctx context.Context, sku string, n, epoch int64, w SaleWindow) error
	// Tally reads the SKU's bookkeeping (ErrSaleNotLoaded when it has
	// none).
	Tally(ctx context.Context, sku string) (Tally, error)
	// Ping checks that the store answers.
	Ping(ctx context.Context) error
}

// SaleRecheck is the transaction of a check of the reservation store
// against the database (a Redis that restarted or failed over): the SKU's
// stock row is locked throughout.
type SaleRecheck interface {
	// Audit reads the sale as it stands in this transaction (Sale is its
	// number).
	Audit(ctx context.Context) (Audit, error)
	// Write records accepted orders not written yet, as the consumer
	// does, whatever their sale number.
	Write(ctx context.Context, orders []Order, keys []IdempotencyRecord) error
	// Renumber gives the sale a new number; its stock and orders stay.
	// Batches of older numbers are refused from the commit on.
	Renumber(ctx context.Context, to int64) error
}

// EpochSales is what the redis-reserve strategy needs from the database:
// sales that carry a number, and the audit of the orders written so far.
type EpochSales interface {
	// StartSaleEpoch starts a sale as Store.StartSaleWindow does and
	// returns its number, which grows with every sale of the SKU and is
	// above atLeast. beforeCommit runs with that number inside the
	// transaction, the SKU's row locked; its error rolls the sale back.
	StartSaleEpoch(ctx context.Context, sku string, n, atLeast int64, w SaleWindow, beforeCommit func(ctx context.Context, epoch int64) error) (epoch int64, err error)
	// Audit reads the SKU's stock and the sum of its orders, as
	// Store.Audit does.
	Audit(ctx context.Context, sku string) (Audit, error)
	// Level reads the SKU's stock row (ErrUnknownSKU when it has none).
	Level(ctx context.Context, sku string) (Level, error)
}

// Reserved counts the stock in a reservation store (Redis) instead of the
// database: one atomic script per order checks the sale, the idempotency
// key and the stock, decrements the stock and appends the order to a
// durable log; the answer waits until that is durable. A consumer writes the
// logged orders to the database afterwards (internal/reservation). The
// invariant: the store's check and decrement are one atomic step on one
// counter loaded once per sale, so no schedule of orders, instances or
// retries takes more than was loaded; the database only follows the log,
// and writes an order only while its sale is the current one.
//
// Every instance that sells a SKU must use this strategy: the database's
// stock is not consulted by the orders, so a SQL strategy writing the same
// SKU would sell the same units again.
type Reserved struct {
	name string
	res  Reservations
	db   EpochSales
}

// ReservedOption configures NewReserved.
type ReservedOption func(*Reserved)

// WithReservedName sets the name recorded on orders (NameRedisWatch for a
// store that takes orders with optimistic transactions). Default
// NameRedisReserve.
func WithReservedName(name string) ReservedOption { return func(r *Reserved) { r.name = name } }

// NewReserved returns the redis-reserve strategy over res and db.
func NewReserved(res Reservations, db EpochSales, opts ...ReservedOption) *Reserved {
	r := &Reserved{name: NameRedisReserve, res: res, db: db}
	for _, o := range opts {
		o(r)
	}
	return r
}

var (
	_ OrderTaker = (*Reserved)(nil)
	_ SaleKeeper = (*Reserved)(nil)
	_ Auditor    = (*Reserved)(nil)
	_ Leveler    = (*Reserved)(nil)
	_ Pinger     = (*Reserved)(nil)
)

// Name implements Strategy.
func (r *Reserved) Name() string { return r.name }

// Deduct implements Strategy; the Service calls TakeOrder instead, which
// owns the whole order.
func (r *Reserved) Deduct(context.Context, string, int64, TxRunner) error {
	return fmt.Errorf("%w: %s takes whole orders, not deductions in a transaction", ErrUnavailable, r.name)
}

// TakeOrder implements OrderTaker: it reserves the order in the store.
func (r *Reserved) TakeOrder(ctx context.Context, o PendingOrder) (Order, error) {
	if o.Order.Hold > 0 {
		// Its returns must go through the store with the order's state;
		// until they do, a hold here would be a final order that claims
		// it can come back. cmd/stock refuses HOLD_TTL with it at start.
		return Order{}, errHoldsNotTaken
	}
	id, err := r.res.Reserve(ctx, Reservation{Order: o.Order, Key: o.IdempotencyKey, Fingerprint: o.Fingerprint, PerUserLimit: o.PerUserLimit})
	if errors.Is(err, ErrSaleNotLoaded) {
		// Tell an unknown SKU (404) from a sale the store lost (503).
		if _, lerr := r.db.Level(ctx, o.Order.SKU); errors.Is(lerr, ErrUnknownSKU) {
			return Order{}, lerr
		}
	}
	if err != nil {
		return Order{}, err
	}
	placed := o.Order
	// A replay: the key's fingerprint matched, so the body is this one.
	placed.ID = id
	return placed, nil
}

// errHoldsNotTaken: the reservation strategies take final orders only.
var errHoldsNotTaken = errors.New("the reservation strategies do not take held orders (HOLD_TTL) yet")

// StartSale starts the sale in the database and loads it into the store.
// The database's transaction numbers the new sale and, before it commits,
// closes the SKU in the store under that number; after the commit the store
// opens the sale. So:
//   - no order of the new sale is taken before the database has forgotten
//     the old one (the store is closed until then), and an order of the old
//     sale still on its way to the database is refused there by its number
//     (ErrStaleSale);
//   - two StartSales of one SKU queue on the row lock, and the store refuses
//     to open a sale older than one announced since: without the close
//     under the row lock, a slow StartSale could open sale e after a faster
//     one had moved the database to e+1, and every order taken in e would
//     be answered 201 and then dropped as stale.
//
// A failure leaves the SKU closed (503) until a StartSale succeeds.
func (r *Reserved) StartSale(ctx context.Context, sku string, n int64) error {
	return r.StartSaleWindow(ctx, sku, n, SaleWindow{})
}

// StartSaleWindow is StartSale with a window: the database records it
// (stock.starts_at, ends_at) and the store checks it on every order, on
// Redis's clock (TIME, in the reserve script): one clock per sale, never an
// instance's.
func (r *Reserved) StartSaleWindow(ctx context.Context, sku string, n int64, w SaleWindow) error {
	var atLeast int64
	for attempt := 0; ; attempt++ {
		epoch, err := r.db.StartSaleEpoch(ctx, sku, n, atLeast, w, func(ctx context.Context, epoch int64) error {
			return r.res.Close(ctx, sku, epoch)
		})
		var behind *SaleNumberBehind
		if errors.As(err, &behind) && attempt == 0 {
			// Number the sale above what the store has seen, once.
			atLeast = behind.Seen
			continue
		}
		if err != nil {
			return err
		}
		if err := r.res.Load(ctx, sku, n, epoch, w); err != nil {
			return fmt.Errorf("load sale %d into the reservation store: %w", epoch, err)
		}
		return nil
	}
}

// Audit counts every accepted order, written to the database yet or not,
// from the store's tally, and checks the database against it. The database
// is read first, so it can only be behind the store, never ahead; and both
// reads must be of one sale: a sale restarted between them is read again
// (a few times, then 503 busy), not reported as drift. Equal sale numbers
// mean one sale throughout: the store is open for sale e only between the
// database's commit of e and the close of e+1, which comes before the
// database's commit of e+1.
func (r *Reserved) Audit(ctx context.Context, sku string) (Audit, error) {
	const attempts = 3
	for range attempts {
		written, err := r.db.Audit(ctx, sku)
		if err != nil {
			return Audit{}, err
		}
		t, err := r.res.Tally(ctx, sku)
		if err != nil {
			return Audit{}, err
		}
		if t.Epoch != written.Sale {
			continue
		}
		if t.Pending == 0 && (written.Ordered < t.Ordered || written.Orders < t.Orders) {
			// Nothing was pending when the store was read, so every order
			// it had accepted by then was in the database: a read of the
			// database now must hold them all (and maybe more).
			later, err := r.db.Audit(ctx, sku)
			if err != nil {
				return Audit{}, err
			}
			if later.Sale != t.Epoch {
				continue
			}
			if later.Ordered < t.Ordered || later.Orders < t.Orders {
				a := r.audit(sku, t, later)
				a.Drift = fmt.Sprintf("nothing is pending, yet the database has %d orders for %d units of the %d for %d accepted: accepted orders were lost on their way to the database",
					later.Orders, later.Ordered, t.Orders, t.Ordered)
				return a, nil
			}
			written = later
		}
		a := r.audit(sku, t, written)
		switch {
		case written.Initial != t.Initial:
			a.Drift = fmt.Sprintf("the database's sale has %d units, the reservation store's %d", written.Initial, t.Initial)
		case !written.Consistent():
			a.Drift = fmt.Sprintf("the database does not add up: initial %d, available %d, ordered %d", written.Initial, written.Available, written.Ordered)
		case written.Ordered > t.Ordered || written.Orders > t.Orders:
			a.Drift = fmt.Sprintf("the database has %d orders for %d units, more than the %d for %d the reservation store accepted: it lost accepted orders (restored from an older copy?)",
				written.Orders, written.Ordered, t.Orders, t.Ordered)
		}
		return a, nil
	}
	return Audit{}, fmt.Errorf("%w: the sale of %q was restarted during each of %d audits", ErrBusy, sku, attempts)
}

// audit is the audit of the store's tally t, with the database's beside it.
func (r *Reserved) audit(sku string, t Tally, written Audit) Audit {
	return Audit{
		SKU: sku, Initial: t.Initial, Available: t.Available, Ordered: t.Ordered, Orders: t.Orders, Sale: t.Epoch,
		// Every order it takes is final: it counts as paid.
		Paid:    t.Ordered,
		Pending: t.Pending, Lag: t.Lag, Written: &written,
	}
}

// Level reports the store's stock: what orders can still take.
func (r *Reserved) Level(ctx context.Context, sku string) (Level, error) {
	t, err := r.res.Tally(ctx, sku)
	if errors.Is(err, ErrSaleNotLoaded) {
		if _, lerr := r.db.Level(ctx, sku); errors.Is(lerr, ErrUnknownSKU) {
			return Level{}, lerr
		}
	}
	if err != nil {
		return Level{}, err
	}
	return Level{Available: t.Available}, nil
}

// Ping checks the reservation store.
func (r *Reserved) Ping(ctx context.Context) error { return r.res.Ping(ctx) }
