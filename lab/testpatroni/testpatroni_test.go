package testpatroni_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale/stock/lab/testpatroni"
)

// The harness's own promise: rows committed under synchronous replication
// survive a kill -9 of the primary, the synchronous standby takes over and
// accepts writes through the multi-host URL, and the killed member comes
// back as a streaming replica with every row.
func TestAKilledPrimaryIsReplacedByItsSynchronousStandbyWithItsCommits(t *testing.T) {
	started := time.Now()
	c := testpatroni.Start(t, testpatroni.Options{})
	t.Logf("%d members, synchronous: ready in %s", len(c.Members), time.Since(started).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	old, err := c.Primary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE orders (id int PRIMARY KEY, phase text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	// One commit per row: each returns only once the synchronous standby
	// has flushed it.
	for id := 1; id <= 100; id++ {
		if _, err := conn.Exec(ctx, `INSERT INTO orders VALUES ($1, 'before')`, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := conn.Close(ctx); err != nil {
		t.Fatal(err)
	}

	killed := time.Now()
	if err := old.Kill(); err != nil {
		t.Fatal(err)
	}
	if old.Running() {
		t.Fatal("a killed member says it runs")
	}
	conn = writeAfterFailover(ctx, t, c)
	t.Logf("killed primary %s: a write succeeded %s later", old.Name, time.Since(killed).Round(time.Millisecond))
	defer conn.Close(context.WithoutCancel(ctx))

	var n, sum int
	if err := conn.QueryRow(ctx, `SELECT count(*), coalesce(sum(id), 0) FROM orders WHERE phase = 'before'`).Scan(&n, &sum); err != nil {
		t.Fatal(err)
	}
	if n != 100 || sum != 5050 {
		t.Fatalf("after the failover: %d committed rows (ids summing to %d), want 100 (5050)", n, sum)
	}
	primary, err := c.Primary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if primary == old {
		t.Fatalf("the killed member %s is still named the primary", old.Name)
	}

	restarted := time.Now()
	if err := old.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("restarted %s: streaming again %s later", old.Name, time.Since(restarted).Round(time.Millisecond))
	replica, err := pgx.Connect(ctx, old.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Close(context.WithoutCancel(ctx))
	var recovering bool
	if err := replica.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&recovering); err != nil || !recovering {
		t.Fatalf("the restarted member: in recovery %v (%v), want a replica", recovering, err)
	}
	// The standby applies WAL after it acknowledges it: poll.
	var rows int
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := replica.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&rows)
		if err == nil && rows == 101 {
			break
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("the restarted member has %d rows (%v), want 101", rows, err)
		}
	}
}

// writeAfterFailover connects through the multi-host URL until a write
// succeeds, with a backoff, bounded by ctx, and returns the connection.
func writeAfterFailover(ctx context.Context, t *testing.T, c *testpatroni.Cluster) *pgx.Conn {
	t.Helper()
	wait := 50 * time.Millisecond
	for {
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err == nil {
			if _, err = conn.Exec(ctx, `INSERT INTO orders VALUES (101, 'after') ON CONFLICT DO NOTHING`); err == nil {
				return conn
			}
			_ = conn.Close(ctx)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			t.Fatalf("no write succeeded after the failover: %v", err)
		}
		wait = min(2*wait, time.Second)
	}
}
