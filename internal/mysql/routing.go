package mysql

import (
	"context"
	"database/sql"
	"slices"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/flashsale/stock/internal/dburl"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/mysqlconn"
)

// On a Galera cluster every node takes writes, and two transactions that
// write one row through two nodes conflict at certification instead of
// queueing on its lock: one is rolled back and runs again. So the store
// keeps a pool per node and begins the transactions of one affinity (an
// order's SKU, a batch's lane) on one node, the same on every instance
// (WithAffinityRouting).
//
// A node's pool connects to that node alone, so its connections never
// move: a pool that followed a failure to the next node and stayed there
// (mysqlconn's way) left two instances writing one SKU through two nodes
// after one transient failure, for as long as its connections lived
// (found by CI: TestEveryInstanceSendsASKUsTransactionsThroughOneGaleraNode).
// A node whose pool cannot begin a transaction is passed over for
// routeRest instead, and its share goes to the next node in address order
// meanwhile; then it is tried first again.

// route is one node's pool.
type route struct {
	db *sql.DB
	// restUntil (Unix ns): passed over until then.
	restUntil atomic.Int64
}

// routeRest is how long a node that could not begin a transaction is
// passed over: long enough not to try a dead node for every transaction,
// short enough that every instance is back on it soon after it serves.
const routeRest = 2 * time.Second

func (r *route) passOver() { r.restUntil.Store(time.Now().Add(routeRest).UnixNano()) }

func (r *route) resting(now int64) bool { return r.restUntil.Load() > now }

// openRoutes opens a pool per node of hosts, each of up to maxConns
// connections (opened as work needs them).
func (s *Store) openRoutes(cfg *mysql.Config, hosts []string, maxConns int) error {
	// Every instance must hash a key to the same node, whatever the
	// order of its URL: the nodes in address order.
	for _, node := range slices.Compact(slices.Sorted(slices.Values(hosts))) {
		c, err := mysqlconn.New(cfg, []string{node})
		if err != nil {
			return err
		}
		s.routes = append(s.routes, &route{db: newPool(c, maxConns)})
	}
	return nil
}

// routesFor are the pools a transaction begun under ctx may run on, in
// the order to try them: its affinity's node's, then the next nodes' in
// address order, those resting last. Nil without routes or affinity: db.
func (s *Store) routesFor(ctx context.Context) []*route {
	key, ok := inventory.AffinityOf(ctx)
	if !ok || len(s.routes) == 0 {
		return nil
	}
	n, home := len(s.routes), inventory.Shard(key, len(s.routes))
	order := make([]*route, 0, n)
	var resting []*route
	now := time.Now().UnixNano()
	for k := range n {
		r := s.routes[(home+k)%n]
		if r.resting(now) {
			resting = append(resting, r)
			continue
		}
		order = append(order, r)
	}
	return append(order, resting...)
}

// Connections is the most connections Open's pools may hold for the URL:
// maxConns, or on a Galera cluster maxConns for the work without an
// affinity and maxConns per node (WithAffinityRouting).
func Connections(url string, maxConns int) int {
	if _, hosts, err := dburl.MySQLNodes(url); err == nil && len(hosts) > 1 {
		return maxConns * (len(hosts) + 1)
	}
	return maxConns
}
