package mysql

import (
	"context"
	"database/sql"

	"github.com/flashsale/stock/internal/dburl"
	"github.com/flashsale/stock/internal/inventory"
)

// On a Galera cluster every node takes writes, and two transactions that
// write one row through two nodes conflict at certification instead of
// queueing on its lock: one is rolled back and runs again. So the store
// keeps a pool per node and sends the transactions of one affinity (an
// order's SKU, a batch's lane) through one node, the same on every
// instance (WithAffinityRouting).

// poolFor is the pool a transaction begun under ctx runs on: its
// affinity's node's (WithAffinityRouting), or db.
func (s *Store) poolFor(ctx context.Context) *sql.DB {
	key, ok := inventory.AffinityOf(ctx)
	if !ok || len(s.routes) == 0 {
		return s.db
	}
	return s.routes[inventory.Shard(key, len(s.routes))]
}

// Connections is the most connections Open's pools may hold for the URL:
// maxConns, or maxConns per node of a Galera cluster (WithAffinityRouting).
func Connections(url string, maxConns int) int {
	if _, hosts, err := dburl.MySQLNodes(url); err == nil && len(hosts) > 1 {
		return maxConns * len(hosts)
	}
	return maxConns
}
