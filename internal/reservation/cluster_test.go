package reservation_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testdb"
	"github.com/flashsale/stock/lab/testredis"
)

// TestClusterSellsOnEveryMasterThroughARestart: on a real three-master
// Redis Cluster (every key of a SKU in the SKU's slot, {sku}), orders for
// SKUs on every master, one master killed and restarted with its AOF in the
// middle of the load. Afterwards every SKU's audit is exact: Redis's tally
// adds up, every 201 is an order row, and once drained the database agrees
// with Redis. Orders for the restarting master's SKUs may get 503 meanwhile;
// the other masters' SKUs keep selling.
func TestClusterSellsOnEveryMasterThroughARestart(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			clusterSale(t, engine)
		})
	}
}

func clusterSale(t *testing.T, engine string) {
	ctx := context.Background()
	cluster := testredis.StartCluster(t, 3)
	cc := cluster.Client(t)
	db := testdb.New(t, engine, 8)
	res := reservation.New(cc, db)
	svc := sales.NewService(db, reservation.NewReserved(res, db), sales.WithOrderTimeout(5*time.Second))
	seen := newWritten()
	for range 3 {
		c := res.NewConsumer(db, reservation.WithConsumerObserver(seen), reservation.WithClaimIdle(time.Second))
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = c.Run(runCtx) }()
		t.Cleanup(func() { cancel(); <-done })
	}

	const skus, stock = 12, 40
	for i := range skus {
		if err := svc.StartSale(ctx, fmt.Sprintf("c-%d", i), stock); err != nil {
			t.Fatalf("start sale c-%d: %v", i, err)
		}
	}
	// Every master holds some SKU: the test is about all of them.
	for _, m := range cluster.Masters {
		n, err := m.Client(t).DBSize(ctx).Result()
		if err != nil || n == 0 {
			t.Fatalf("master %s holds %d keys (%v): pick SKUs that spread", m.Addr, n, err)
		}
	}

	type answer struct {
		sku string
		id  string
		err error
	}
	const attempts = skus * stock * 2
	answers := make([]answer, attempts)
	var next atomic.Int64
	restartAt := int64(attempts / 3)
	restarted := make(chan struct{})
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < attempts; i = next.Add(1) - 1 {
				if i == restartAt {
					go func() {
						defer close(restarted)
						cluster.Masters[1].Stop()
						cluster.Masters[1].Restart(t)
					}()
				}
				sku := fmt.Sprintf("c-%d", i%skus)
				o, err := svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: fmt.Sprint("u-", i)})
				answers[i] = answer{sku: sku, id: o.ID, err: err}
			}
		})
	}
	wg.Wait()
	<-restarted
	cluster.WaitOK(t)

	created, unknown := map[string]int64{}, map[string]int64{}
	var unavailable int
	for _, a := range answers {
		switch {
		case a.err == nil:
			created[a.sku]++
		case errors.Is(a.err, inventory.ErrSoldOut):
		case errors.Is(a.err, inventory.ErrOutcomeUnknown):
			unknown[a.sku]++
		case errors.Is(a.err, inventory.ErrUnavailable), errors.Is(a.err, inventory.ErrBusy):
			unavailable++
		default:
			t.Errorf("%s: unexpected answer %v", a.sku, a.err)
		}
	}
	t.Logf("%d orders answered 201 across %d SKUs, %d outcome unknown, %d refused 503 during the restart", sum(created), skus, sum(unknown), unavailable)

	// Drain: every SKU's orders written.
	for i := range skus {
		sku := fmt.Sprintf("c-%d", i)
		a := waitPendingZero(t, svc, seen, sku)
		written, err := db.Audit(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		if !a.Consistent() || a.Available < 0 || a.Orders < created[sku] || a.Orders > created[sku]+unknown[sku] {
			t.Errorf("%s: audit %+v for %d created and %d unknown", sku, a, created[sku], unknown[sku])
		}
		if written.Orders != a.Orders || written.Available != a.Available || !written.Consistent() {
			t.Errorf("%s: the database %+v does not agree with Redis %+v", sku, written, a)
		}
	}
	for _, a := range answers {
		if a.err != nil {
			continue
		}
		if _, found, err := db.FindOrder(ctx, a.id); err != nil || !found {
			t.Errorf("order %s of %s was answered 201 and is not in the database (%v)", a.id, a.sku, err)
		}
	}
	if sum(created) == 0 {
		t.Fatal("nothing was sold")
	}
}

// waitPendingZero waits, at each batch the consumers write, until sku's
// audit has nothing pending; it fails after 30 seconds.
func waitPendingZero(t *testing.T, svc *sales.Service, seen *written, sku string) inventory.Audit {
	t.Helper()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		_, change := seen.orders.now()
		a, err := svc.Audit(context.Background(), sku)
		if err == nil && a.Pending == 0 {
			return a
		}
		// A claim of a dead connection's batch may take a claim bound:
		// wake at the next batch, or check again after it.
		tick := time.NewTimer(time.Second)
		select {
		case <-change:
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("%s: still pending after 30s: %+v %v", sku, a, err)
		}
		tick.Stop()
	}
}

func sum(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}
