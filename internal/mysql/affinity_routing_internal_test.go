package mysql

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/lab/testgalera"
)

// nodeOfTx is the port of the node a transaction begun under ctx runs on.
func nodeOfTx(ctx context.Context, t *testing.T, s *Store) string {
	t.Helper()
	tx, done, err := s.beginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer done(nil)
	var port int
	if err := tx.QueryRowContext(ctx, "SELECT @@port").Scan(&port); err != nil {
		t.Fatal(err)
	}
	return strconv.Itoa(port)
}

// Instances deployed as docs/replicated.md deploys them on Galera, each
// with its own node first in DATABASE_URL, send one SKU's transactions
// through one node, whichever instance takes the order: through two nodes,
// two transactions of one row conflict at certification and one is rolled
// back (batched's burst kept 0.31x of the single server's so). The SKUs
// spread over the nodes; work without an affinity stays on each URL's
// first node.
func TestEveryInstanceSendsASKUsTransactionsThroughOneGaleraNode(t *testing.T) {
	ctx := context.Background()
	c := testgalera.Start(t, testgalera.Options{})
	if err := c.CreateDatabase(ctx, 0, "stock"); err != nil {
		t.Fatal(err)
	}
	var instances []*Store
	for i := range c.Addrs() {
		s, err := Open(ctx, c.URLFrom(i, "stock"), WithMaxConns(2))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		instances = append(instances, s)
	}
	if got, want := Connections(c.URLFrom(0, "stock"), 2), 2*(len(c.Addrs())+1); got != want {
		t.Errorf("Connections = %d, want %d: a pool of 2 per node, and one for the work without an affinity", got, want)
	}
	used := map[string]int{}
	for k := range 24 {
		sku := fmt.Sprintf("sku-%d", k)
		at := inventory.WithAffinity(ctx, sku)
		node := nodeOfTx(at, t, instances[0])
		for i, s := range instances[1:] {
			if other := nodeOfTx(at, t, s); other != node {
				t.Fatalf("%s: instance 0 writes it through the node on port %s, instance %d through %s", sku, node, i+1, other)
			}
		}
		used[node]++
	}
	if len(used) != len(c.Addrs()) {
		t.Errorf("24 SKUs went through the nodes %v, want every one of the %d", used, len(c.Addrs()))
	}
	for i, s := range instances {
		want := c.Addrs()[i]
		if got := nodeOfTx(ctx, t, s); "127.0.0.1:"+got != want {
			t.Errorf("instance %d, no affinity: through the node on port %s, want its URL's first, %s", i, got, want)
		}
	}
}

// A SKU's node killed: its transactions begin on the next node in address
// order, on every instance, and once the node serves again (and its rest
// of routeRest is over) they go back to it.
func TestASKUsTransactionsMoveToTheNextNodeWhileItsNodeIsDownAndComeBack(t *testing.T) {
	ctx := context.Background()
	c := testgalera.Start(t, testgalera.Options{})
	if err := c.CreateDatabase(ctx, 0, "stock"); err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, c.URLFrom(1, "stock"), WithMaxConns(2))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	// A SKU whose node is node 0, whose next in address order is another.
	var sku string
	for k := 0; sku == ""; k++ {
		at := inventory.WithAffinity(ctx, fmt.Sprint("sku-", k))
		if "127.0.0.1:"+nodeOfTx(at, t, s) == c.Addrs()[0] {
			sku = fmt.Sprint("sku-", k)
		}
	}
	at := inventory.WithAffinity(ctx, sku)
	if err := c.Nodes[0].Kill(); err != nil {
		t.Fatal(err)
	}
	if got := "127.0.0.1:" + nodeOfTx(at, t, s); got == c.Addrs()[0] {
		t.Fatalf("%s's transaction began on its killed node %s", sku, got)
	}
	if err := c.Nodes[0].Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// The node serves again; its rest is what is under test here.
	time.Sleep(routeRest + 100*time.Millisecond)
	if got := "127.0.0.1:" + nodeOfTx(at, t, s); got != c.Addrs()[0] {
		t.Fatalf("after the node came back, %s's transaction began on %s, want its node %s", sku, got, c.Addrs()[0])
	}
}
