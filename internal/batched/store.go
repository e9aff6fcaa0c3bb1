package batched

import (
	"context"
	"time"

	"github.com/flashsale/stock/internal/inventory"
)

// Store is what the batched strategy needs from a database: one
// transaction for the orders of a batch, and the lookup of an order whose
// commit answer was lost. Errors are wrapped as inventory.Store's are.
type Store interface {
	// InBatchTx runs fn in one transaction and commits it when fn returns
	// nil, as inventory.Store.InTx does (inventory.ErrOutcomeUnknown when
	// the commit answer was lost).
	InBatchTx(ctx context.Context, fn func(ctx context.Context, tx Tx) error) error
}

// Deduction is what DeductEach did to one SKU's row.
type Deduction struct {
	// Deducted: the total was taken.
	Deducted bool
	// Exists: the SKU has a stock row.
	Exists bool
	// Held: another transaction held the row, which was skipped, neither
	// locked nor read (DeductEachSkippingHeld).
	Held bool
	// Level is the row as read under its lock, before the deduction. The
	// lock is held until the transaction ends, so a SKU not deducted is
	// planned again from it without another read (a catalog's batch is
	// mostly sold-out SKUs: a read each cost a round trip each).
	Level inventory.Level
}

// Tx is the transaction of a batch of orders, of one SKU or of many.
type Tx interface {
	// DeductIfAvailable subtracts total only if at least total is
	// available, and bumps the version.
	DeductIfAvailable(ctx context.Context, sku string, total int64) (bool, error)
	// DeductEach subtracts totals[i] from skus[i] (distinct, in SKU byte
	// order) for each SKU whose sale is open and has that much available,
	// bumping their versions, in one statement (a read and an UPDATE on
	// MariaDB), with the rows locked in the order given; it reports, in
	// the order of skus, which it deducted and each row as it read it
	// under its lock. A SKU without a row is not deducted.
	DeductEach(ctx context.Context, skus []string, totals []int64) ([]Deduction, error)
	// DeductEachSkippingHeld is DeductEach for a lane's batch: it never
	// waits for a row. A row another transaction holds is neither locked
	// nor deducted, and comes back Held (FOR UPDATE SKIP LOCKED), so that
	// one held row holds up only its own SKU's orders.
	DeductEachSkippingHeld(ctx context.Context, skus []string, totals []int64) ([]Deduction, error)
	// LockLevel reads the stock row and locks it until the transaction
	// ends: SELECT … FOR UPDATE (inventory.ErrUnknownSKU when there is
	// none).
	LockLevel(ctx context.Context, sku string) (inventory.Level, error)
	// FindIdempotencyKeys reads the records of the keys that have one.
	FindIdempotencyKeys(ctx context.Context, keys []string) (map[string]inventory.IdempotencyRecord, error)
	// GetOrder reads an order by id.
	GetOrder(ctx context.Context, id string) (inventory.Order, error)
	// ResolveOrder looks order id of sku up once every transaction that
	// holds sku's stock row has ended, as inventory.Tx.ResolveOrder does:
	// found is final.
	ResolveOrder(ctx context.Context, sku, id string) (o inventory.Order, found bool, err error)
	// InsertOrders records accepted orders in one statement and returns
	// their expiries, in the orders' order, as inventory.Tx.InsertOrder
	// does for one.
	InsertOrders(ctx context.Context, orders []inventory.Order) ([]time.Time, error)
	// InsertIdempotencyRecords stores the records whose key does not exist
	// yet, in one statement, waiting for concurrent transactions holding
	// the same keys, and reports how many it inserted: fewer than given
	// means another request committed one of the keys first.
	InsertIdempotencyRecords(ctx context.Context, records []inventory.IdempotencyRecord) (inserted int, err error)
	// ClaimFirstUnits creates the count of each buyer of claims that has
	// none in sku's sale, with its claim as its units, in one statement,
	// in buyer order, and returns those buyers; a buyer with a count, or
	// one created by a transaction that commits first, is left alone
	// (PER_USER_LIMIT).
	ClaimFirstUnits(ctx context.Context, sku string, claims map[string]int64) (created []string, err error)
	// LockBuyers reads the units each of userIDs holds or has paid for in
	// sku's sale (the buyers that have none are absent) (PER_USER_LIMIT),
	// to plan the batch; an adapter may lock the rows it finds until the
	// transaction ends (PostgreSQL does; MariaDB does not, as a locking
	// read there gap-locks a missing row). ClaimUnitsOf decides.
	LockBuyers(ctx context.Context, sku string, userIDs []string) (map[string]int64, error)
	// ClaimUnitsOf adds each buyer's units of claims to its count, each
	// only while it stays within limit, in buyer order; held is what
	// LockBuyers read. False when any was refused (a buyer row created
	// since LockBuyers read them): the transaction must then not commit.
	ClaimUnitsOf(ctx context.Context, sku string, claims, held map[string]int64, limit int64) (bool, error)
	// ReleaseUnitsOf gives each buyer's units of units back to its count
	// (claimed by ClaimUnitsOf earlier in the transaction, for orders the
	// stock then could not cover), in one statement.
	ReleaseUnitsOf(ctx context.Context, sku string, units map[string]int64) error
}
