package dblock_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/locking/dblock"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testgalera"
)

// TestAcquisitionsThatLoseACertificationConflictOnGaleraWaitTheirTurn:
// two lockers take one name through two nodes of a Galera cluster. An
// acquisition that conflicts with the other node's fails its certification
// with error 1213, and Galera retries an autocommit statement only
// wsrep_retry_autocommit times (1 by default; 0 here, so every conflict
// reaches the client). The statement did nothing: the lock was simply
// taken, so Acquire must poll again, not fail the order as a database
// error (found by CI: db-lock through two Galera nodes answered 503).
func TestAcquisitionsThatLoseACertificationConflictOnGaleraWaitTheirTurn(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Galera cluster")
	}
	c := testgalera.Start(t, testgalera.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const db = "dblock_galera"
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

	const perLocker, goroutines, rounds = 2, 4, 15
	var (
		inside, taken atomic.Int64
		wg            sync.WaitGroup
		errs          = make(chan error, perLocker*goroutines*rounds)
		tokens        sync.Map
	)
	for node := range perLocker {
		l := open(t, c.URLFrom(node, db)+"?wsrep_retry_autocommit=0", dblock.WithWait(time.Minute))
		for range goroutines {
			wg.Go(func() {
				for range rounds {
					lease, err := l.Acquire(ctx, "galera")
					if err != nil {
						errs <- err
						return
					}
					if n := inside.Add(1); n != 1 {
						t.Errorf("%d holders at once", n)
					}
					if _, dup := tokens.LoadOrStore(lease.Token(), true); dup {
						t.Errorf("token %d issued twice", lease.Token())
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
		t.Errorf("an acquisition or release failed: %v", err)
	}
	if want := int64(perLocker * goroutines * rounds); taken.Load() != want {
		t.Errorf("took the lock %d times, want %d", taken.Load(), want)
	}
}
