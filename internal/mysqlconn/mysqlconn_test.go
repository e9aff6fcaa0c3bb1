package mysqlconn_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // the "mysql" driver, for the direct connection to a node

	"github.com/flashsale/stock/internal/dburl"
	"github.com/flashsale/stock/internal/mysqlconn"
	"github.com/flashsale/stock/lab/testdb"
	"github.com/flashsale/stock/lab/testgalera"
)

// open is a pool over the nodes of rawURL through a Connector.
func open(t *testing.T, rawURL string) *sql.DB {
	t.Helper()
	cfg, hosts, err := dburl.MySQLNodes(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	c, err := mysqlconn.New(cfg, hosts)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// Several hosts are the nodes of one Galera cluster: a server that is not
// a Galera node (here the machine's own MariaDB) is refused, rather than
// written to beside the cluster.
func TestAServerThatIsNotAGaleraNodeIsRefused(t *testing.T) {
	base := os.Getenv("TEST_MYSQL_URL")
	if base == "" {
		base = testdb.DefaultMySQLURL
	}
	cfg, err := dburl.MySQL(base)
	if err != nil {
		t.Fatal(err)
	}
	db := open(t, "mysql://root@"+cfg.Addr+","+cfg.Addr+"/mysql")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = db.PingContext(ctx)
	if !errors.Is(err, mysqlconn.ErrNotReady) {
		t.Fatalf("a MariaDB outside any Galera cluster: %v, want ErrNotReady", err)
	}
}

// A node that lost the cluster's majority (two of three killed) still
// accepts connections, but refuses every query: the connector refuses it
// with the reason, and takes a node that serves again once there is one.
func TestANodeWithoutTheClusterMajorityIsRefusedAndAServingOneTaken(t *testing.T) {
	c := testgalera.Start(t, testgalera.Options{})
	db := open(t, "mysql://root@"+strings.Join([]string{c.Nodes[2].Addr, c.Nodes[0].Addr}, ",")+"/mysql")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("a cluster that serves: %v", err)
	}
	db.SetMaxIdleConns(0) // every query dials: the test watches Connect
	for _, n := range c.Nodes[:2] {
		if err := n.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	// Node 2 notices the loss of the majority after Galera's suspect
	// timeout (3 s in lab/testgalera).
	var err error
	for tick := time.NewTicker(100 * time.Millisecond); ; {
		if err = db.PingContext(ctx); errors.Is(err, mysqlconn.ErrNotReady) {
			tick.Stop()
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("node 2 alone was still taken a minute after the others were killed: %v", err)
		case <-tick.C:
		}
	}
	if !strings.Contains(err.Error(), "wsrep_ready is OFF") {
		t.Errorf("the refusal does not say why: %v", err)
	}
	// What an operator does when the majority is lost for good: make the
	// survivor a primary component of its own.
	node2 := open(t, "mysql://root@"+c.Nodes[2].Addr+"/mysql")
	node2.SetMaxIdleConns(0)
	if _, err := node2.ExecContext(ctx, "SET GLOBAL wsrep_provider_options = 'pc.bootstrap=YES'"); err == nil {
		t.Fatal("the connector connected to a node that does not serve")
	}
	direct, err := dburl.MySQL("mysql://root@" + c.Nodes[2].Addr + "/mysql")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := sql.Open("mysql", direct.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.ExecContext(ctx, "SET GLOBAL wsrep_provider_options = 'pc.bootstrap=YES'"); err != nil {
		t.Fatalf("bootstrap node 2: %v", err)
	}
	if err := c.WaitSynced(ctx, 1); err != nil {
		t.Fatal(err)
	}
	var one int
	if err := db.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("once node 2 serves again: %v", err)
	}
}
