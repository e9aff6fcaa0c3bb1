// Package mysqlconn connects the service to one of several MySQL-protocol
// servers that are the nodes of one MariaDB Galera cluster: a
// DATABASE_URL naming several hosts (mysql://root@h1:3306,h2:3306/stock).
// Every node of a Galera cluster takes writes, and a write set that
// conflicts with one another node committed first fails at its commit
// (error 1213, answered as a conflict and run again), so the service may
// use any node; this package picks one that is up and serves, and moves
// on when it stops.
package mysqlconn

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/go-sql-driver/mysql"
)

// Connector is a database/sql connector over the nodes of a Galera
// cluster. A new connection goes to the node that served the last one, or
// to the next node that is up and serves when that one fails, in the
// order of the URL. Connections already open to a node that fails fail
// with it, and database/sql replaces them through Connect.
type Connector struct {
	nodes     []driver.Connector
	addrs     []string
	preferred atomic.Int32
}

var _ driver.Connector = (*Connector)(nil)

// New returns the connector of cfg's database on each of addrs (host:port),
// with cfg's other settings. Each connection runs, on top of cfg's
// parameters:
//
//   - SET SESSION wsrep_sync_wait = 1, unless cfg sets it: a read waits
//     until the node has applied every write set the cluster committed
//     before it. Without it a node answers reads from the state it has
//     applied so far (Galera applies other nodes' commits after
//     certifying them, a little later), so an order answered 201 through
//     one node could be missing from a read on another: a buyer's lookup,
//     and the lookup that settles a commit whose answer was lost, which
//     would then answer "not taken" for an order that was.
//
// and is kept only if its node says wsrep_ready = ON: a node cut off from
// the cluster's majority (non-primary) accepts connections but refuses
// every query (error 1047), and a node that is not a Galera node at all
// is refused too, since several hosts mean the nodes of one cluster.
func New(cfg *mysql.Config, addrs []string) (*Connector, error) {
	if len(addrs) == 0 {
		return nil, errors.New("mysqlconn: no host")
	}
	c := &Connector{addrs: addrs}
	for _, addr := range addrs {
		node := cfg.Clone()
		node.Addr = addr
		if node.Params == nil {
			node.Params = map[string]string{}
		}
		if _, set := node.Params["wsrep_sync_wait"]; !set {
			node.Params["wsrep_sync_wait"] = "1"
		}
		conn, err := mysql.NewConnector(node)
		if err != nil {
			return nil, fmt.Errorf("mysqlconn: %s: %w", addr, err)
		}
		c.nodes = append(c.nodes, conn)
	}
	return c, nil
}

// Connect implements driver.Connector: a connection to the preferred node,
// or to the first node after it that is up and ready. The errors of every
// node tried are joined.
func (c *Connector) Connect(ctx context.Context) (driver.Conn, error) {
	start := int(c.preferred.Load())
	var errs []error
	for i := range c.nodes {
		n := (start + i) % len(c.nodes)
		conn, err := c.nodes[n].Connect(ctx)
		if err == nil {
			if err = ready(ctx, conn); err != nil {
				_ = conn.Close()
			}
		}
		if err == nil {
			c.preferred.Store(int32(n))
			return conn, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", c.addrs[n], err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("no node of %v serves: %w", c.addrs, errors.Join(errs...))
}

// Driver implements driver.Connector.
func (c *Connector) Driver() driver.Driver { return c.nodes[0].Driver() }

// Addrs are the nodes, in the URL's order.
func (c *Connector) Addrs() []string { return c.addrs }

// ErrNotReady: a node is not in the cluster's primary component, or is
// not a Galera node.
var ErrNotReady = errors.New("the node does not serve")

// ready asks conn's node whether it serves: wsrep_ready = ON.
func ready(ctx context.Context, conn driver.Conn) error {
	q, ok := conn.(driver.QueryerContext)
	if !ok {
		return fmt.Errorf("%w: the driver's connection cannot query", ErrNotReady)
	}
	rows, err := q.QueryContext(ctx, "SHOW GLOBAL STATUS LIKE 'wsrep_ready'", nil)
	if err != nil {
		return err
	}
	defer rows.Close()
	row := make([]driver.Value, len(rows.Columns()))
	if err := rows.Next(row); err != nil || len(row) < 2 {
		return fmt.Errorf("%w: no wsrep_ready status (not a Galera node: several hosts in DATABASE_URL are the nodes of one Galera cluster)", ErrNotReady)
	}
	if v := fmt.Sprintf("%s", row[1]); v != "ON" {
		return fmt.Errorf("%w: wsrep_ready is %s (not in the cluster's primary component)", ErrNotReady, v)
	}
	return nil
}
