package inventory

import (
	"context"
	"errors"
	"time"
)

// Store is what the service needs from a database. Errors are wrapped in the
// sentinels of this package (ErrUnknownSKU, ErrConflict, ErrUnavailable,
// ErrBusy, ErrOutcomeUnknown) so the service can decide what to retry.
type Store interface {
	// InTx runs fn in one transaction and commits it when fn returns nil.
	// A commit whose answer was lost returns an error wrapping
	// ErrOutcomeUnknown.
	InTx(ctx context.Context, fn func(ctx context.Context, tx Tx) error) error
	// Level reads a SKU's stock outside any transaction.
	Level(ctx context.Context, sku string) (Level, error)
	// StartSale sets a SKU's stock and initial stock to n (creating it) and
	// deletes its orders and idempotency records, all in one transaction.
	// It bumps the row's version and keeps its fence: versions and fencing
	// tokens only ever grow, across sales too, so that a write decided in
	// the old sale (a compare-and-set holding an old version, a paused lock
	// holder) can never land in the new one.
	StartSale(ctx context.Context, sku string, n int64) error
	// StartSaleWindow is StartSale with a window: orders are refused
	// before w.StartsAt and from w.EndsAt on, by the database's clock (a
	// zero time: no bound).
	StartSaleWindow(ctx context.Context, sku string, n int64, w SaleWindow) error
	// StartSaleWith is every start of a sale (SaleStart says what it
	// records besides) and returns the sale's number. ErrAdminKeyTaken
	// when st.Key's key exists already: nothing was started.
	StartSaleWith(ctx context.Context, st SaleStart) (sale int64, err error)
	// StartCatalogWith is many starts in one transaction (CatalogStart
	// says what it records besides) and returns their sales' numbers, in
	// c.Starts' order. ErrAdminKeyTaken when c.Key's key exists already:
	// nothing was started.
	StartCatalogWith(ctx context.Context, c CatalogStart) (sales []int64, err error)
	// Audit reads the SKU's stock and the sum of its orders from one
	// snapshot.
	Audit(ctx context.Context, sku string) (Audit, error)
	// FindOrder looks an order up by id; found is false when there is none.
	FindOrder(ctx context.Context, id string) (o Order, found bool, err error)
	// ResolveRestock looks restock id of sku up once every transaction
	// that holds sku's stock row has ended, as Tx.ResolveOrder does for an
	// order: found is final.
	ResolveRestock(ctx context.Context, sku, id string) (found bool, err error)
	// ListOrders lists at most limit orders of buyer userID (of sku only,
	// when sku is not ""), by id (the order they were placed in), those
	// after after ("" for the first).
	ListOrders(ctx context.Context, userID, sku, after string, limit int) ([]Order, error)
	// BuyerUnits reads the units each of userIDs holds or has paid for in
	// sku's current sale (PER_USER_LIMIT; a buyer with none is absent),
	// outside any transaction and locking nothing: what a claim would
	// find at that moment.
	BuyerUnits(ctx context.Context, sku string, userIDs []string) (map[string]int64, error)
	// FindAdminKey reads the record of an admin write's key; found is
	// false when there is none (or it is older than AdminKeyRetention).
	FindAdminKey(ctx context.Context, key string) (r AdminRecord, found bool, err error)
	// FindRestockByKey reads the restock of sku's current sale made with
	// key; found is false when there is none.
	FindRestockByKey(ctx context.Context, sku, key string) (r Restock, found bool, err error)
	// Ping checks that the database answers.
	Ping(ctx context.Context) error
}

// Tx is one transaction, as the strategies and the service use it: the
// parts below, each named for who calls it.
type Tx interface {
	StockTx
	OrderTx
	LifecycleTx
	AdminTx
}

// StockTx is the SKU's stock row, as a strategy that deducts (Deduct,
// through TxRunner) sees it in the order's transaction. Each Deduct*
// method subtracts quantity from available and bumps the version.
type StockTx interface {
	// ReadLevel reads the stock row without locking it (ErrUnknownSKU when
	// there is none).
	ReadLevel(ctx context.Context, sku string) (Level, error)
	// LockLevel reads the stock row and locks it until the transaction
	// ends: SELECT … FOR UPDATE.
	LockLevel(ctx context.Context, sku string) (Level, error)
	// Deduct subtracts unconditionally: safe only under a lock.
	Deduct(ctx context.Context, sku string, quantity int64) error
	// DeductIfVersion subtracts only if the row still has that version.
	DeductIfVersion(ctx context.Context, sku string, quantity, version int64) (bool, error)
	// DeductIfAvailable subtracts only if at least quantity is available.
	DeductIfAvailable(ctx context.Context, sku string, quantity int64) (bool, error)
	// DeductIfFenced subtracts only if the row's fence is lower than token
	// and its version is still readVersion, the one the lock holder read,
	// and stores token as the new fence. Fencing orders the writes of
	// successive lock holders; the version check validates the read that
	// the write was decided on. False means the write was refused: a newer
	// holder wrote, or the row changed since the read.
	DeductIfFenced(ctx context.Context, sku string, quantity, token, readVersion int64) (bool, error)
}

// OrderTx records orders: the Service, and the strategies that take whole
// orders (batched).
type OrderTx interface {
	// InsertOrder records an accepted order (with o.Claimed) and returns
	// its expiry: o.ExpiresAt when set, else for a held order the
	// database's now() + o.Hold; zero for a final one.
	InsertOrder(ctx context.Context, o Order) (expiresAt time.Time, err error)
	// GetOrder reads an order by id.
	GetOrder(ctx context.Context, id string) (Order, error)
	// ResolveOrder looks order id of sku up once every transaction that
	// holds sku's stock row has ended (a share lock on the row, which every
	// order's transaction writes): a commit whose answer was lost has then
	// landed or never will, so found is final. It costs a wait behind the
	// row's writers, and is only for an order whose commit answer was lost.
	ResolveOrder(ctx context.Context, sku, id string) (o Order, found bool, err error)
	// FindIdempotency reads the record of a key; found is false when there
	// is none.
	FindIdempotency(ctx context.Context, key string) (r IdempotencyRecord, found bool, err error)
	// InsertIdempotency stores a record unless the key exists already; it
	// waits for a concurrent transaction holding the same key and reports
	// false when that one committed first.
	InsertIdempotency(ctx context.Context, r IdempotencyRecord) (inserted bool, err error)
	// ClaimUnits adds quantity to the units userID holds or has paid for
	// in sku's sale, only if the total stays within limit; false when it
	// would not. It locks the buyer's row until the transaction ends, so
	// two orders of one buyer queue on it (PER_USER_LIMIT).
	ClaimUnits(ctx context.Context, sku, userID string, quantity, limit int64) (bool, error)
}

// LifecycleTx moves orders out of held and gives their units back
// (internal/sales's lifecycle). Each transition is one conditional
// statement on the order row, judged by the database's clock; the units
// come back only in the transaction whose transition changed the row.
type LifecycleTx interface {
	// SettleOrder moves order id of userID out of OrderHeld to to:
	// OrderPaid or OrderCancelled only while its hold has not lapsed
	// (expires_at > now()), OrderExpired only once it has. False when the
	// row did not match (another state, the other side of expires_at,
	// another buyer, no such order).
	SettleOrder(ctx context.Context, id, userID, to string) (bool, error)
	// ReturnUnits adds quantity back to sku's available stock. It leaves
	// the version alone: a return only adds, so a read that saw enough
	// stock stays true after it, and every deduction subtracts from the
	// row as it is (available = available - q).
	ReturnUnits(ctx context.Context, sku string, quantity int64) error
	// ExpireLapsed moves at most limit held orders whose hold has lapsed to
	// OrderExpired, skipping rows another transaction has locked, and
	// returns them (ID, SKU, Quantity).
	ExpireLapsed(ctx context.Context, limit int) ([]Order, error)
	// ReleaseUnits gives quantity back to userID's count for sku (a
	// cancel, an expiry); no row, nothing to give back.
	ReleaseUnits(ctx context.Context, sku, userID string, quantity int64) error
	// ReturnEach is ReturnUnits for several SKUs in one statement:
	// returns name distinct SKUs in byte order, the order their rows are
	// locked in, each with the Quantity to add. A SKU without a row is
	// ErrUnknownSKU and nothing is added (the sweep: its cost follows the
	// lapsed holds, not how many SKUs they are spread over).
	ReturnEach(ctx context.Context, returns []Order) error
	// ReleaseEach is ReleaseUnits for several buyers of several SKUs in
	// one statement: claims are distinct (SKU, UserID) pairs in byte
	// order, the order their rows are locked in, each with the Quantity
	// to give back; a buyer without a row has nothing to give back.
	ReleaseEach(ctx context.Context, claims []Order) error
	// MarkRelay marks orders whose units this transaction returns for
	// the relay to the store that counts the stock outside the database
	// (the reservation strategies: ReturnRelay): the mark commits with the
	// return, so the units reach that store even if this process dies.
	MarkRelay(ctx context.Context, ids []string) error
}

// AdminTx is what the admin writes (a restock, an admin key) record.
type AdminTx interface {
	// RecordRestock records restock r in the restock's transaction, for
	// the audit and, when relay is set, for the same relay as returns.
	RecordRestock(ctx context.Context, r Restock, relay bool) error
	// Restock adds quantity to sku's available and restocked units, the
	// version left alone as a return leaves it, and returns the units
	// available after it and the sale's number; ok is false when sku has
	// no sale.
	Restock(ctx context.Context, sku string, quantity int64) (available, sale int64, ok bool, err error)
	// InsertAdminKey stores the record of an admin write's key unless the
	// key exists already (false; it waits for a concurrent transaction
	// holding the same key), and deletes a few records older than
	// AdminKeyRetention.
	InsertAdminKey(ctx context.Context, r AdminRecord) (inserted bool, err error)
}

// SaleStart is one start of a sale as the store runs it, in one
// transaction: the SKU's stock row set to Available within Window, its
// orders, buyers' counts, restocks and order keys deleted.
type SaleStart struct {
	SKU       string
	Available int64
	Window    SaleWindow
	// AtLeast: the sale's number is above it (a number the reservation
	// store has seen already).
	AtLeast int64
	// Key, when its Key is set, is recorded in the start's transaction
	// with the sale's number; the start fails with ErrAdminKeyTaken when
	// the key exists already.
	Key AdminRecord
	// BeforeCommit, when set, runs with the sale's number inside the
	// transaction, the stock row locked; its error rolls the start back.
	BeforeCommit func(ctx context.Context, sale int64) error
}

// Finish is the end of every store's start transaction, once the sale's
// row holds number sale: st.Key recorded with that number
// (ErrAdminKeyTaken when the key exists already), then st.BeforeCommit.
func (st SaleStart) Finish(ctx context.Context, tx interface {
	InsertAdminKey(ctx context.Context, r AdminRecord) (bool, error)
}, sale int64) error {
	if st.Key.Key != "" {
		key := st.Key
		key.Sale = sale
		inserted, err := tx.InsertAdminKey(ctx, key)
		if err != nil {
			return err
		}
		if !inserted {
			return ErrAdminKeyTaken
		}
	}
	if st.BeforeCommit == nil {
		return nil
	}
	return st.BeforeCommit(ctx, sale)
}

// ErrAdminKeyTaken: an admin write's Idempotency-Key was recorded by
// another transaction first; nothing of this one was written.
var ErrAdminKeyTaken = errors.New("admin idempotency key taken")
