package reservation

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flashsale/stock/internal/inventory"
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
	ErrSaleNotLoaded = fmt.Errorf("%w: the sale is not loaded in the reservation store", inventory.ErrUnavailable)
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
	Order        inventory.Order
	Key          string
	Fingerprint  []byte
	PerUserLimit int64
	// Mark is PendingOrder.Mark: asked again, when not nil, by a store
	// whose order waits its turn before its round trip (redis-watch's
	// gate and retries); its refusal is Reserve's answer, as is.
	Mark inventory.SoldOutMark
}

// Taken is a reservation's answer: the id of the order that answers it,
// and when the store took that order, on the store's clock (a held
// order's hold runs from then: it expires at At + its hold, in whole
// milliseconds). At is zero when the store does not say (a replay of an
// earlier request's key).
type Taken struct {
	OrderID string
	At      time.Time
}

// HoldEnds is when a hold of d that began at taken ends, as the store's
// consumer writes it: whole milliseconds, as the store keeps both.
func HoldEnds(taken time.Time, d time.Duration) time.Time {
	return taken.Add(d.Truncate(time.Millisecond)).UTC()
}

// Tally is the reservation store's bookkeeping of one SKU's sale.
type Tally struct {
	Epoch     int64
	Initial   int64
	Available int64
	// Ordered and Orders count every accepted order, in the database yet
	// or not, returned since or not; Returned and Returns count the
	// returned orders whose units came back to the store (the relay).
	Ordered  int64
	Orders   int64
	Returned int64
	Returns  int64
	// Restocked is what restocks added to the sale in the store.
	Restocked int64
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
	// returns the order that answers the request: r.Order.ID, or the
	// order an earlier request with the same key created. It returns only
	// once the order is durable.
	Reserve(ctx context.Context, r Reservation) (Taken, error)
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
	Load(ctx context.Context, sku string, n, epoch int64, w inventory.SaleWindow) error
	// CloseCatalog and LoadCatalog are Close and Load for many SKUs, sale
	// sales[i] for the i-th: a catalog's start. A *SaleNumberBehind from
	// CloseCatalog names the highest number the store had seen among the
	// SKUs it was behind for; LoadCatalog leaves a SKU whose newer sale
	// was started meanwhile to that sale.
	CloseCatalog(ctx context.Context, skus []string, sales []int64) error
	LoadCatalog(ctx context.Context, starts []inventory.SaleStart, sales []int64) error
	// Resume is Load for a start whose database transaction committed
	// and whose load may not have run (a retry of the start): it opens
	// sale epoch only on a store that holds its announcement (Close) and
	// no later one, ErrSaleNotLoaded on a store that lost it (wiped, or
	// restored from an older copy), which may have lost the sale's orders
	// with it.
	Resume(ctx context.Context, sku string, n, epoch int64, w inventory.SaleWindow) error
	// TallyReplicated is Tally, then, when the store holds a sale of the
	// SKU and has replicas to wait for, a wait until what it read is on
	// them, asked of the server that answered the Tally (Close, Load,
	// their catalog forms and Resume wait already): a retried start that
	// finds its sale loaded asks it before it answers.
	TallyReplicated(ctx context.Context, sku string) (Tally, error)
	// Return gives back to sale epoch the units of returned orders (ID,
	// Quantity, UserID), each once per sale however often it is called
	// with it: ErrStaleSale when the store holds another sale of the SKU,
	// ErrSaleNotLoaded when it holds none, ErrBusy while the sale is
	// being checked.
	Return(ctx context.Context, sku string, epoch int64, returns []inventory.Order) error
	// Restock adds restocks (ID, Quantity) to sale epoch, each once per
	// sale however often it is called with it; its errors are Return's.
	Restock(ctx context.Context, sku string, epoch int64, restocks []inventory.Order) error
	// GiveBack is Return (kind Returns) or Restock for several SKUs at
	// once, marked[i]'s error at errs[i].
	GiveBack(ctx context.Context, kind RelayKind, marked []Marked) (errs []error)
	// Tally reads the SKU's bookkeeping (ErrSaleNotLoaded when it has
	// none).
	Tally(ctx context.Context, sku string) (Tally, error)
	// Buyers reads the units each of userIDs has taken in the SKU's sale
	// (PER_USER_LIMIT; a buyer with none is absent), as the reserve script
	// counts them.
	Buyers(ctx context.Context, sku string, userIDs []string) (map[string]int64, error)
	// Ping checks that the store answers.
	Ping(ctx context.Context) error
}

// SaleRecheck is the transaction of a check of the reservation store
// against the database (a Redis that restarted or failed over): the SKU's
// stock row is locked throughout.
type SaleRecheck interface {
	// Audit reads the sale as it stands in this transaction (Sale is its
	// number).
	Audit(ctx context.Context) (inventory.Audit, error)
	// Write records accepted orders not written yet, as the consumer
	// does, whatever their sale number.
	Write(ctx context.Context, orders []inventory.Order, keys []inventory.IdempotencyRecord) error
	// Renumber gives the sale a new number; its stock and orders stay.
	// Batches of older numbers are refused from the commit on.
	Renumber(ctx context.Context, to int64) error
	// ReturnedOrders lists every order of the sale that gave its units
	// back (cancelled or expired), relayed yet or not.
	ReturnedOrders(ctx context.Context) ([]inventory.Order, error)
	// Restocks lists every restock of the sale (ID, Quantity), relayed
	// yet or not.
	Restocks(ctx context.Context) ([]inventory.Order, error)
}

// EpochSales is what the redis-reserve strategy needs from the database:
// sales that carry a number, and the audit of the orders written so far.
type EpochSales interface {
	// StartSaleWith starts a sale as Store.StartSaleWith does and
	// returns its number, which grows with every sale of the SKU and is
	// above st.AtLeast. st.BeforeCommit runs with that number inside the
	// transaction, the SKU's row locked; its error rolls the sale back.
	StartSaleWith(ctx context.Context, st inventory.SaleStart) (epoch int64, err error)
	// StartCatalogWith starts many sales as Store.StartCatalogWith does;
	// c.BeforeCommit runs with their numbers, every row locked.
	StartCatalogWith(ctx context.Context, c inventory.CatalogStart) (sales []int64, err error)
	// SaleRows reads the stock rows of skus, by SKU (absent: none).
	SaleRows(ctx context.Context, skus []string) (map[string]inventory.SaleRow, error)
	// Audit reads the SKU's stock and the sum of its orders, as
	// Store.Audit does.
	Audit(ctx context.Context, sku string) (inventory.Audit, error)
	// Level reads the SKU's stock row (ErrUnknownSKU when it has none).
	Level(ctx context.Context, sku string) (inventory.Level, error)
	// RelayMarked hands to apply at most limit of the orders (kind
	// Returns) or restocks (kind Restocks) of skus marked for the relay
	// (Tx.MarkRelay, Tx.RecordRestock), by SKU, each SKU's with the
	// number of its sale read with them in one statement; it clears the
	// marks of the SKUs apply answers taken, leaves the others marked, and
	// reports how many it handed over. No transaction is open while apply
	// runs, so apply may be handed an order again (a second relay, a lost
	// clear) and must take each once.
	RelayMarked(ctx context.Context, skus []string, kind RelayKind, limit int, apply func(ctx context.Context, marked []Marked) (taken []string, err error)) (int, error)
	// SKUsRelaying lists at most limit SKUs with orders or restocks
	// marked for the relay.
	SKUsRelaying(ctx context.Context, limit int) ([]string, error)
}

// Reserved counts the stock in a reservation store (Redis) instead of the
// database: one atomic script per order checks the sale, the idempotency
// key and the stock, decrements the stock and appends the order to a
// durable log; the answer waits until that is durable. A consumer writes the
// logged orders to the database afterwards (internal/reservation). The
// invariant: the store's check and decrement are one atomic step on one
// counter loaded once per sale, so no schedule of orders, instances or
// retries takes more than was loaded; the database only follows the log,
// and writes an order only while its sale is the current one. Units come
// back to the counter only through the relay (RelayReturns), for an order
// the database moved out of held or a restock it made, once each.
//
// Held orders, pay, cancel and expiry are the database's (the service's
// transitions), so every guarantee of the lifecycle is the SQL
// strategies'; a held order's hold starts when the stream writes it.
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

// Strategy implements Strategic: it takes whole orders, keeps the sale, its
// books and its stock in the store, and relays the database's returns.
func (r *Reserved) Strategy() inventory.Strategy {
	return inventory.Strategy{Name: r.name, TakeOrder: r.TakeOrder, StartSale: r.StartSaleWith, FinishStart: r.FinishStart,
		StartCatalog: r.StartCatalog, FinishCatalog: r.FinishCatalog,
		RelayReturns: r.RelayReturns, Audit: r.Audit, Level: r.Level, Ping: r.Ping, BuyerUnits: r.BuyerUnits}
}

// TakeOrder reserves the order in the store.
func (r *Reserved) TakeOrder(ctx context.Context, o inventory.PendingOrder) (inventory.Order, error) {
	if o.PerUserLimit > 0 {
		// The store counts it on the buyer's count with the stock, and
		// its return gives it back (Claimed travels with the order).
		o.Order.Claimed = o.Order.Quantity
	}
	taken, err := r.res.Reserve(ctx, Reservation{Order: o.Order, Key: o.IdempotencyKey, Fingerprint: o.Fingerprint, PerUserLimit: o.PerUserLimit, Mark: o.Mark})
	if errors.Is(err, ErrSaleNotLoaded) {
		// Tell an unknown SKU (404) from a sale the store lost (503).
		if _, lerr := r.db.Level(ctx, o.Order.SKU); errors.Is(lerr, inventory.ErrUnknownSKU) {
			return inventory.Order{}, lerr
		}
	}
	if err != nil {
		return inventory.Order{}, err
	}
	placed := o.Order
	// A replay: the key's fingerprint matched, so the body is this one.
	placed.ID = taken.OrderID
	if o.Order.Hold > 0 && !taken.At.IsZero() {
		// The hold runs from the store's acceptance, on its clock: the
		// consumer writes this expiry with the order.
		placed.ExpiresAt = HoldEnds(taken.At, o.Order.Hold)
	}
	return placed, nil
}

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
	return r.StartSaleWindow(ctx, sku, n, inventory.SaleWindow{})
}

// StartSaleWindow is StartSale with a window: the database records it
// (stock.starts_at, ends_at) and the store checks it on every order, on
// Redis's clock (TIME, in the reserve script): one clock per sale, never an
// instance's.
func (r *Reserved) StartSaleWindow(ctx context.Context, sku string, n int64, w inventory.SaleWindow) error {
	return r.StartSaleWith(ctx, inventory.SaleStart{SKU: sku, Available: n, Window: w})
}

// StartSaleWith is the strategy's StartSale: the database's start (with st.Key)
// closes the store's older sale before it commits, then the store loads
// the new one.
func (r *Reserved) StartSaleWith(ctx context.Context, st inventory.SaleStart) error {
	for attempt := 0; ; attempt++ {
		start := st
		start.BeforeCommit = func(ctx context.Context, epoch int64) error {
			return r.res.Close(ctx, st.SKU, epoch)
		}
		epoch, err := r.db.StartSaleWith(ctx, start)
		var behind *SaleNumberBehind
		if errors.As(err, &behind) && attempt == 0 {
			// Number the sale above what the store has seen, once.
			st.AtLeast = behind.Seen
			continue
		}
		if err != nil {
			return err
		}
		if err := r.res.Load(ctx, st.SKU, st.Available, epoch, st.Window); err != nil {
			return fmt.Errorf("load sale %d into the reservation store: %w", epoch, err)
		}
		return nil
	}
}

// FinishStart is the strategy's FinishStart, for a retry of a start the database
// recorded: nothing to do when the store holds that sale or a newer one,
// or the database has a newer one. Otherwise the store is loaded, but only
// while the database has no order of the sale: a store that held the sale,
// took orders and lost it since (a wipe) must not sell its units again; it
// stays closed (503) until a new sale is started, as it does without a
// retry. Load itself refuses a sale older than one the store has closed.
func (r *Reserved) FinishStart(ctx context.Context, st inventory.SaleStart, epoch int64) error {
	t, err := r.res.TallyReplicated(ctx, st.SKU)
	switch {
	case err == nil && t.Epoch/saleNumberStride >= epoch/saleNumberStride:
		// Loaded on the primary, perhaps by the attempt that was answered
		// 503 because its replicas did not confirm the load: now they have.
		return nil
	case err != nil && !errors.Is(err, ErrSaleNotLoaded):
		return err
	}
	written, err := r.db.Audit(ctx, st.SKU)
	if err != nil {
		return err
	}
	if written.Sale/saleNumberStride > epoch/saleNumberStride {
		return nil
	}
	if written.Orders > 0 || written.Returned > 0 {
		return fmt.Errorf("%w: the reservation store lost sale %d of %q after it took orders: start a new sale", inventory.ErrUnavailable, epoch, st.SKU)
	}
	// The store must still hold the start's announcement: one that lost it
	// (a wipe) cannot tell a sale never loaded from one that was loaded,
	// sold and lost with orders not yet written here (found by review:
	// TestRetriedStartNeverReopensASaleWhoseUnwrittenOrdersRedisLost).
	err = r.res.Resume(ctx, st.SKU, st.Available, epoch, st.Window)
	if errors.Is(err, inventory.ErrStaleSale) {
		return nil
	}
	if err != nil && !errors.Is(err, ErrSaleNotLoaded) {
		return fmt.Errorf("load sale %d into the reservation store: %w", epoch, err)
	}
	return err
}

// saleNumberStride is the step between two sales' numbers: a check of the
// store renumbers a sale by adding one, within its stride.
const saleNumberStride = 1 << 20

// Audit counts every accepted order, written to the database yet or not,
// from the store's tally, and checks the database against it. It reads the
// store, then the database, then the store again; all three must be of one
// sale (a sale restarted meanwhile is read again, a few times, then 503
// busy). Equal sale numbers mean one sale throughout: the store is open for
// sale e only between the database's commit of e and the close of e+1,
// which comes before the database's commit of e+1.
//
// Both sides only ever grow the counts compared, and each follows the
// other one way: the database writes only orders the store took, and the
// store takes back only returns the database made. So, with the database
// read between the store's two reads, these hold at every moment and are
// checked without a race (found by review: comparing one read of each, a
// cancel relayed between them looked like drift):
//   - the database took no more than the store had taken by its second
//     read (else it holds orders the store lost: restored from an older
//     copy);
//   - the store took back no more, by its first read, than the database
//     had returned;
//   - when nothing was pending at the store's first read, the database
//     holds every order the store had taken by then (else orders were lost
//     on their way to it);
//   - every return the database made and the store had not taken back by
//     its second read is still marked for the relay (else returns were
//     lost on their way to the store).
func (r *Reserved) Audit(ctx context.Context, sku string) (inventory.Audit, error) {
	const attempts = 3
	for range attempts {
		first, err := r.res.Tally(ctx, sku)
		if err != nil {
			return inventory.Audit{}, err
		}
		written, err := r.db.Audit(ctx, sku)
		if err != nil {
			return inventory.Audit{}, err
		}
		second, err := r.res.Tally(ctx, sku)
		if err != nil {
			return inventory.Audit{}, err
		}
		if first.Epoch != written.Sale || second.Epoch != written.Sale {
			continue
		}
		// Every order and every unit the database ever took in the sale,
		// returned since or not.
		takenOrders := written.Orders + written.Cancelled + written.Expired
		takenUnits := written.Ordered + written.Returned
		a := r.audit(sku, second, written)
		switch {
		case written.Initial != second.Initial:
			a.Drift = fmt.Sprintf("the database's sale has %d units, the reservation store's %d", written.Initial, second.Initial)
		case !written.Consistent():
			a.Drift = fmt.Sprintf("the database does not add up: initial %d, available %d, ordered %d", written.Initial, written.Available, written.Ordered)
		case takenOrders > second.Orders || takenUnits > second.Ordered:
			a.Drift = fmt.Sprintf("the database has %d orders for %d units, more than the %d for %d the reservation store accepted: it lost accepted orders (restored from an older copy?)",
				takenOrders, takenUnits, second.Orders, second.Ordered)
		case first.Returned > written.Returned || first.Restocked > written.Restocked:
			a.Drift = fmt.Sprintf("the reservation store took back %d units and was restocked with %d, more than the %d the database returned and the %d it restocked",
				first.Returned, first.Restocked, written.Returned, written.Restocked)
		case first.Pending == 0 && (takenOrders < first.Orders || takenUnits < first.Ordered):
			a.Drift = lostOnTheirWay(takenOrders, takenUnits, first)
		case written.Returned+written.Restocked-second.Returned-second.Restocked > written.Relaying:
			a.Drift = fmt.Sprintf("the database gave back %d units and restocked %d, with %d on their way to the reservation store, which took back %d and was restocked with %d: returns or restocks were lost on their way to it",
				written.Returned, written.Restocked, written.Relaying, second.Returned, second.Restocked)
		case first.Pending > 0 && second.Pending == 0:
			// Orders were on their way at the first read and none at the
			// second: a read of the database after it must hold every
			// order taken by then (the consumer acknowledges an entry
			// only after writing it).
			later, err := r.db.Audit(ctx, sku)
			if err != nil {
				return inventory.Audit{}, err
			}
			if later.Sale != second.Epoch {
				continue
			}
			laterOrders, laterUnits := later.Orders+later.Cancelled+later.Expired, later.Ordered+later.Returned
			if laterOrders < second.Orders || laterUnits < second.Ordered {
				a = r.audit(sku, second, later)
				a.Drift = lostOnTheirWay(laterOrders, laterUnits, second)
			}
		}
		return a, nil
	}
	return inventory.Audit{}, fmt.Errorf("%w: the sale of %q was restarted during each of %d audits", inventory.ErrBusy, sku, attempts)
}

// lostOnTheirWay is the drift of a database that misses orders the store
// took when nothing was on its way.
func lostOnTheirWay(orders, units int64, t Tally) string {
	return fmt.Sprintf("nothing was pending, yet the database has %d orders for %d units of the %d for %d accepted: accepted orders were lost on their way to the database",
		orders, units, t.Orders, t.Ordered)
}

// liveTally is t with the returned orders taken out of Ordered and Orders:
// what the store counts as sold now.
func liveTally(t Tally) Tally {
	t.Ordered, t.Orders = t.Ordered-t.Returned, t.Orders-t.Returns
	return t
}

// audit is the audit of the store's tally t, with the database's beside it.
// Held, Paid, the returns and what is in flight come from the database;
// what the store took but the database has not written yet is Pending.
func (r *Reserved) audit(sku string, t Tally, written inventory.Audit) inventory.Audit {
	live := liveTally(t)
	return inventory.Audit{
		SKU: sku, Initial: t.Initial, Restocked: t.Restocked, Available: t.Available, Ordered: live.Ordered, Orders: live.Orders, Sale: t.Epoch,
		Held: written.Held, Paid: written.Paid, Returned: written.Returned, Cancelled: written.Cancelled, Expired: written.Expired,
		Relaying: written.Relaying, RelayingOrders: written.RelayingOrders, Restocks: written.Restocks,
		Pending: t.Pending, Lag: t.Lag, Written: &written,
	}
}

// Level reports the store's stock: what orders can still take.
func (r *Reserved) Level(ctx context.Context, sku string) (inventory.Level, error) {
	t, err := r.res.Tally(ctx, sku)
	if errors.Is(err, ErrSaleNotLoaded) {
		if _, lerr := r.db.Level(ctx, sku); errors.Is(lerr, inventory.ErrUnknownSKU) {
			return inventory.Level{}, lerr
		}
	}
	if err != nil {
		return inventory.Level{}, err
	}
	return inventory.Level{Available: t.Available}, nil
}

// Ping checks the reservation store.
func (r *Reserved) Ping(ctx context.Context) error { return r.res.Ping(ctx) }

// BuyerUnits reads the buyers' units the reserve script counts
// (PER_USER_LIMIT), for the sold-out mark's answers.
func (r *Reserved) BuyerUnits(ctx context.Context, sku string, userIDs []string) (map[string]int64, error) {
	return r.res.Buyers(ctx, sku, userIDs)
}
