package testgalera_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/flashsale/stock/lab/testgalera"
)

// errDeadlock is what Galera answers the commit of a transaction that
// lost a certification conflict, or that a replicated writeset aborted.
const errDeadlock = 1213

func TestAWriteOnOneNodeIsReadOnAnotherAndAKilledNodeRejoins(t *testing.T) {
	began := time.Now()
	c := testgalera.Start(t, testgalera.Options{})
	t.Logf("%d nodes synced in %v", len(c.Nodes), time.Since(began).Round(time.Millisecond))
	// Every statement is bounded: a node that hangs fails the test, not
	// the whole run.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	db0 := open(t, c.Nodes[0])
	for _, q := range []string{
		"CREATE DATABASE shop",
		"CREATE TABLE shop.stock (sku INT PRIMARY KEY, qty INT NOT NULL)",
		"INSERT INTO shop.stock VALUES (1, 10)",
	} {
		if _, err := db0.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s on node0: %v", q, err)
		}
	}
	db2 := open(t, c.Nodes[2])
	if got := qty(t, db2, 1); got != 10 {
		t.Fatalf("node2 reads qty %d of the row node0 inserted, want 10", got)
	}

	// Two transactions update the same row on two nodes; the first commit
	// wins and the other transaction is aborted: Galera has no lock
	// across nodes, only certification at commit.
	db1 := open(t, c.Nodes[1])
	tx0 := begin(t, db0)
	tx1 := begin(t, db1)
	for i, tx := range []*sql.Tx{tx0, tx1} {
		if _, err := tx.ExecContext(ctx, "UPDATE shop.stock SET qty = qty - 1 WHERE sku = 1"); err != nil {
			t.Fatalf("update in transaction %d: %v", i, err)
		}
	}
	if err := tx0.Commit(); err != nil {
		t.Fatalf("first commit, on node0: %v", err)
	}
	err := tx1.Commit()
	if me, ok := errors.AsType[*mysql.MySQLError](err); !ok || me.Number != errDeadlock {
		t.Fatalf("second commit, on node1, of an update of the same row: %v, want MySQL error %d", err, errDeadlock)
	}
	if got := qty(t, db1, 1); got != 9 {
		t.Fatalf("qty after one of two conflicting decrements: %d, want 9", got)
	}

	// Closed first: the driver logs a pool's failed goodbye to a killed
	// server.
	_ = db1.Close()
	killed := c.Nodes[1]
	if err := killed.Kill(); err != nil {
		t.Fatal(err)
	}
	if killed.Running() || killed.PID() != 0 {
		t.Fatalf("node1 runs after Kill: pid %d", killed.PID())
	}
	began = time.Now()
	if err := c.WaitSynced(ctx, 2); err != nil {
		t.Fatal(err)
	}
	t.Logf("2 nodes synced %v after the kill", time.Since(began).Round(time.Millisecond))
	if _, err := db2.ExecContext(ctx, "INSERT INTO shop.stock VALUES (2, 5)"); err != nil {
		t.Fatalf("insert on node2 while node1 is down: %v", err)
	}

	began = time.Now()
	if err := killed.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitSynced(ctx, 3); err != nil {
		t.Fatal(err)
	}
	t.Logf("node1 rejoined in %v", time.Since(began).Round(time.Millisecond))
	if got := qty(t, open(t, killed), 2); got != 5 {
		t.Fatalf("restarted node1 reads qty %d of the row inserted while it was down, want 5", got)
	}
}

// open returns a pool of root connections to node, closed at t's cleanup.
func open(t *testing.T, node *testgalera.Node) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", "root@tcp("+node.Addr+")/")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func begin(t *testing.T, db *sql.DB) *sql.Tx {
	t.Helper()
	tx, err := db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	return tx
}

// qty reads a row's qty after the node has applied every writeset the
// cluster had committed when the read began (wsrep_sync_wait=1): a read
// on another node than the write's would otherwise race its applier.
func qty(t *testing.T, db *sql.DB, sku int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, err := db.Conn(ctx) // SET SESSION holds for this connection only
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET SESSION wsrep_sync_wait = 1"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRowContext(ctx, "SELECT qty FROM shop.stock WHERE sku = ?", sku).Scan(&n); err != nil {
		t.Fatalf("read sku %d: %v", sku, err)
	}
	return n
}
