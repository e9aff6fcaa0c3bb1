// Package store opens the database that DATABASE_URL names with the adapter
// of its engine: postgres:// and postgresql:// go to internal/postgres,
// mysql:// to internal/mysql.
package store

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/mysql"
	"github.com/flashsale/stock/internal/postgres"
	"github.com/flashsale/stock/internal/reservation"
)

// Store is an inventory.Store (and a batched.Store, for the batched
// strategy) that can also migrate its schema and close.
type Store interface {
	inventory.Store
	batched.Store
	// PersistReservedEach serves the reservation strategies' consumers
	// (reservation.Sink); PersistReserved is the same for one SKU's batch.
	PersistReservedEach(ctx context.Context, batches []reservation.SaleBatch) ([]reservation.SaleBatchOutcome, error)
	PersistReserved(ctx context.Context, sku string, epoch int64, orders []inventory.Order, keys []inventory.IdempotencyRecord) (int, error)
	// RelayMarked and SKUsRelaying serve the relay of their returns and
	// restocks (inventory.ReturnRelay).
	RelayMarked(ctx context.Context, skus []string, kind reservation.RelayKind, limit int, apply func(ctx context.Context, marked []reservation.Marked) ([]string, error)) (int, error)
	SKUsRelaying(ctx context.Context, limit int) ([]string, error)
	RecheckSale(ctx context.Context, sku string, check func(ctx context.Context, r reservation.SaleRecheck) error) error
	// SKUsAfter lists the SKUs on sale (every one with a stock row) a
	// page at a time, in order, for the audit job.
	SKUsAfter(ctx context.Context, after string, limit int) ([]string, error)
	// SaleRows serves the reservation strategies' retried catalog start
	// (reservation.EpochSales).
	SaleRows(ctx context.Context, skus []string) (map[string]inventory.SaleRow, error)
	Migrate(ctx context.Context) error
	Close()
}

// Engines names the engines, as Engine reports them.
var Engines = []string{"postgres", "mysql"}

// Engine returns "postgres" or "mysql" for a DATABASE_URL, or an error that
// says which schemes are understood.
func Engine(databaseURL string) (string, error) {
	u, err := url.Parse(databaseURL)
	if err != nil {
		return "", fmt.Errorf("DATABASE_URL: %w", err)
	}
	switch u.Scheme {
	case "postgres", "postgresql":
		return "postgres", nil
	case "mysql":
		return "mysql", nil
	}
	return "", fmt.Errorf("DATABASE_URL: scheme %q is not postgres://, postgresql:// or mysql://", u.Scheme)
}

// Option configures Open.
type Option func(*options)

type options struct {
	stuckTx    time.Duration
	noAffinity bool
}

// WithAffinityRouting sets whether, on a MariaDB Galera cluster (a URL
// naming several hosts), each transaction goes through the node its
// affinity hashes to (mysql.WithAffinityRouting). Default true; off, every
// transaction goes through the URL's first node that serves (tests that
// make two nodes certify one row's writes against each other).
func WithAffinityRouting(on bool) Option {
	return func(o *options) { o.noAffinity = !on }
}

// WithStuckTransactionTimeout bounds how long a transaction that stopped
// moving — its client frozen mid-order — can hold a row lock over the
// others: PostgreSQL ends a session idle in a transaction for longer
// (idle_in_transaction_session_timeout), MySQL fails a statement that waits
// longer for a row lock (innodb_lock_wait_timeout). Default 0: the
// servers' settings (no limit, and 50 s).
func WithStuckTransactionTimeout(d time.Duration) Option {
	return func(o *options) { o.stuckTx = d }
}

// Connections is the most connections Open may hold to the database at
// databaseURL with maxConns: more on a Galera cluster, a pool per node.
func Connections(databaseURL string, maxConns int) int {
	if engine, err := Engine(databaseURL); err == nil && engine == "mysql" {
		return mysql.Connections(databaseURL, maxConns)
	}
	return maxConns
}

// Open connects to the database with a pool of maxConns connections (per
// node of a Galera cluster: Connections).
func Open(ctx context.Context, databaseURL string, maxConns int, opts ...Option) (Store, error) {
	engine, err := Engine(databaseURL)
	if err != nil {
		return nil, err
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if engine == "mysql" {
		return mysql.Open(ctx, databaseURL, mysql.WithMaxConns(maxConns), mysql.WithLockWaitTimeout(o.stuckTx),
			mysql.WithAffinityRouting(!o.noAffinity))
	}
	return postgres.Open(ctx, databaseURL, postgres.WithMaxConns(int32(maxConns)), postgres.WithIdleInTransactionTimeout(o.stuckTx))
}
