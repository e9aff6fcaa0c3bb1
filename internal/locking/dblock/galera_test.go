package dblock_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/flashsale/stock/internal/locking"
	"github.com/flashsale/stock/internal/locking/dblock"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testgalera"
)

// TestAcquisitionsThatLoseACertificationConflictOnGaleraWaitTheirTurn:
// lockers take one name through two nodes of a Galera cluster. An
// acquisition that conflicts with
// another node's write fails its certification with error 1213, and
// Galera retries an autocommit statement only wsrep_retry_autocommit
// times (1 by default; 0 here, so every conflict reaches the client). The
// statement wrote nothing: Acquire must poll again, not fail the order as
// a database error (found by CI: db-lock through two Galera nodes answered
// 503). Then an admin resets the name through the third node while they
// go on: a release or reset that lost to the other's write must run
// again, not fail (a release that failed left the lock held for its
// lease; found by review).
func TestAcquisitionsThatLoseACertificationConflictOnGaleraWaitTheirTurn(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Galera cluster")
	}
	c := testgalera.Start(t, testgalera.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const db, name = "dblock_galera", "galera"
	if err := c.CreateDatabase(ctx, 0, db); err != nil {
		t.Fatal(err)
	}
	s, err := store.Open(ctx, c.URLFrom(0, db), 2)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Migrate(ctx)
	s.Close()
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	conflictsBefore := conflicts(ctx, t, c)

	const lockers, goroutines, rounds = 2, 4, 15
	var (
		inside, taken, slowest atomic.Int64
		wg                     sync.WaitGroup
		errs                   = make(chan error, lockers*goroutines*rounds+1)
	)
	for node := range lockers {
		l := open(t, c.URLFrom(node, db)+"?wsrep_retry_autocommit=0", dblock.WithWait(time.Minute))
		// The row as this locker's node has it: a holder's token is the
		// row's while it holds the lock, whoever else tries.
		row := nodeDB(t, c.Nodes[node].Addr, db)
		for range goroutines {
			wg.Go(func() {
				for range rounds {
					began := time.Now()
					lease, err := l.Acquire(ctx, name)
					if err != nil {
						errs <- err
						return
					}
					raiseTo(&slowest, int64(time.Since(began)))
					if n := inside.Add(1); n != 1 {
						t.Errorf("%d holders at once", n)
					}
					var token int64
					if err := row.QueryRowContext(ctx, "SELECT token FROM stock_locks WHERE name = ?", name).Scan(&token); err != nil {
						errs <- err
					} else if token != lease.Token() {
						t.Errorf("holding token %d, the row on its node has %d", lease.Token(), token)
					}
					inside.Add(-1)
					taken.Add(1)
					if err := lease.Release(ctx); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a statement failed: %v", err)
	}
	if want := int64(lockers * goroutines * rounds); taken.Load() != want {
		t.Errorf("took the lock %d times, want %d", taken.Load(), want)
	}
	// A lock left held by an acquisition whose answer hid a success
	// would have made the next wait out its lease.
	if d := time.Duration(slowest.Load()); d >= ttl {
		t.Errorf("the slowest acquisition waited %v, the lease (%v): a lock was left held", d, ttl)
	}
	var owner sql.NullString
	if err := nodeDB(t, c.Nodes[2].Addr, db).QueryRowContext(ctx, "SELECT owner FROM stock_locks WHERE name = ?", name).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	if owner.Valid {
		t.Errorf("after every lease was released the row is owned by %s", owner.String)
	}
	resetWhileHeld(ctx, t, c, db, name)
	got := conflicts(ctx, t, c) - conflictsBefore
	t.Logf("%d acquisitions, the slowest in %v; %d certification failures and aborts on the nodes", taken.Load(), time.Duration(slowest.Load()).Round(time.Millisecond), got)
	if got == 0 {
		t.Errorf("no certification conflict on any node: the test did not exercise what it is for")
	}
}

// raiseTo sets v to x if x is larger, whatever other goroutines store
// meanwhile (a Load then a Store could lose a larger value).
func raiseTo(v *atomic.Int64, x int64) {
	for old := v.Load(); x > old && !v.CompareAndSwap(old, x); old = v.Load() {
	}
}

// nodeDB is a pool on one node of the cluster, for reading what that node has.
func nodeDB(t *testing.T, addr, db string) *sql.DB {
	t.Helper()
	d, err := sql.Open("mysql", "root@tcp("+addr+")/"+db+"?timeout=5s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// conflicts is the cluster's count of statements that lost to another
// node's write: failed certifications and brute-force aborts, summed over
// the nodes.
func conflicts(ctx context.Context, t *testing.T, c *testgalera.Cluster) int64 {
	t.Helper()
	var sum int64
	for _, n := range c.Nodes {
		rows, err := nodeDB(t, n.Addr, "mysql").QueryContext(ctx,
			"SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_local_cert_failures', 'wsrep_local_bf_aborts')")
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var name string
			var v int64
			if err := rows.Scan(&name, &v); err != nil {
				t.Fatal(err)
			}
			sum += v
		}
		if err := rows.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return sum
}

// resetWhileHeld: lockers take name through node 0 while an admin resets
// it through node 1, each statement certified against the other's. A
// reset frees a held lock (a new sale), so holders may overlap here (the
// fence guards their writes). Acquire and Release must never fail (a
// lease the reset ended is lost, not an error of the database). A reset
// may: Galera's certification is optimistic, and under a stream of
// acquisitions through another node a reset can lose every run (found
// here, 1 run in 2 of this test); it is answered 503 and the admin's
// start is retried under its key. Most resets must go through.
func resetWhileHeld(ctx context.Context, t *testing.T, c *testgalera.Cluster, db, name string) {
	const goroutines, rounds = 4, 15
	l := open(t, c.URLFrom(0, db)+"?wsrep_retry_autocommit=0", dblock.WithWait(time.Minute))
	admin := open(t, c.URLFrom(1, db)+"?wsrep_retry_autocommit=0")
	errs := make(chan error, goroutines*rounds+1)
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range rounds {
				lease, err := l.Acquire(ctx, name)
				if err != nil {
					errs <- err
					return
				}
				if err := lease.Release(ctx); err != nil && !errors.Is(err, locking.ErrLockLost) {
					errs <- err
					return
				}
			}
		})
	}
	stop, resets, refused := make(chan struct{}), 0, 0
	go func() { wg.Wait(); close(stop) }()
	for stopped := false; !stopped; resets++ {
		if err := admin.Reset(ctx, name); err != nil {
			if !isConflict(err) {
				t.Errorf("a reset failed for another reason than a lost conflict: %v", err)
			}
			refused++
		}
		select {
		case <-stop:
			stopped = true
		default:
		}
	}
	close(errs)
	for err := range errs {
		t.Errorf("while an admin reset the lock through another node: %v", err)
	}
	t.Logf("%d resets beside %d acquisitions, %d of them lost every run to the acquisitions", resets, goroutines*rounds, refused)
	if refused*2 > resets {
		t.Errorf("%d of %d resets lost every run: the runs again do not get resets through", refused, resets)
	}
}

// isConflict: err is MySQL's 1213, a statement that lost to another write.
func isConflict(err error) bool {
	me, ok := errors.AsType[*mysql.MySQLError](err)
	return ok && me.Number == 1213
}
