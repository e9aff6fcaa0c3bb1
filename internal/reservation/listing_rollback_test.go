package reservation_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/reservation"
)

// TestSaleOpenedAcrossARedisRollbackIsListed: Redis comes back from an
// older copy of its data (a failover to a replica that lagged, a restored
// backup) while a StartSale is between its Close (the SKU listed in the
// catalog, the sale closed) and its Load. The copy predates the listing,
// and the Load opens the sale on it all the same: a fresh sale, correct in
// itself, but one that no catalog lists. An instance takes an order (201)
// and dies before its consumer reads it; a live consumer in another process
// sweeps the catalog again and again and never finds the stream. The order
// must be written (or the sale must not open unlisted).
//
//	copy of Redis taken (the SKU was never listed)
//	StartSale: Close (ZADD catalog, DEL sale), database commits sale E
//	Redis comes back from the copy: no listing, no sale, no epoch
//	StartSale: Load(E) opens the sale (E is above the copy's nothing), replid current
//	instance A: order 201 (no check: the sale was loaded under the current id); A dies
//	instance C: sweeps the catalog every 20 ms; the SKU is not in it; the order stays unwritten
func TestSaleOpenedAcrossARedisRollbackIsListed(t *testing.T) {
	s := newSale(t, "postgres") // instance A: sells, runs no consumer (it dies)
	const sku = "listed-across-rollback"
	ctx := context.Background()
	backup := s.redis.Snapshot(t) // the lagging replica's copy: nothing of the SKU

	gate := &gatedSales{Store: s.db, started: make(chan int64), release: make(chan struct{})}
	started := make(chan error, 1)
	go func() { started <- reservation.NewReserved(s.res, gate).StartSale(ctx, sku, 5) }()
	epoch := <-gate.started // listed and closed in Redis, committed in the database; Load pending
	if _, err := s.rdb.ZScore(ctx, catalogKey, sku).Result(); err != nil {
		t.Fatalf("the SKU is not listed after StartSale's Close: %v", err)
	}

	s.redis.Restore(t, backup)
	// The pool's connections died with the server: let the client find
	// out before the Load, so that the Load reaches the restored server.
	for s.rdb.Ping(ctx).Err() != nil {
	}
	close(gate.release)
	if err := <-started; err != nil {
		t.Logf("StartSale of sale %d after the rollback: %v (the sale stays closed: correct)", epoch, err)
		return
	}
	o, err := s.order(sku, 2, "buyer", "")
	if err != nil {
		t.Logf("order after the rollback: %v (refused: correct)", err)
		return
	}
	_, listedErr := s.rdb.ZScore(ctx, catalogKey, sku).Result()
	t.Logf("sale %d open after the rollback, order %s answered 201; catalog entry: %v", epoch, o.ID, listedErr)

	// Instance A dies. Instance C: a live consumer in another process.
	lst := listings{newCounter()}
	crdb := redis.NewClient(&redis.Options{Addr: s.redis.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	crdb.AddHook(lst)
	t.Cleanup(func() { _ = crdb.Close() })
	seen := newWritten()
	c := reservation.New(crdb, s.db).NewConsumer(s.db, reservation.WithConsumerObserver(seen),
		reservation.WithClaimIdle(time.Millisecond), reservation.WithSweep(20*time.Millisecond))
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(cctx) }()
	t.Cleanup(func() { cancel(); <-done })
	// Three listings: the round of each of the first two sweeps (and its
	// writes) is over when the third begins.
	lst.waitFor(t, 3, "sweeps of the catalog")

	_, found, err := s.db.FindOrder(ctx, o.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !found {
		pending, _ := s.rdb.XLen(ctx, "stock:{"+sku+"}:orders").Result()
		t.Errorf("order %s answered 201 is not in the database after three sweeps of a live consumer: the sale was opened unlisted (catalog: %v), and its %d entries wait unread", o.ID, listedErr, pending)
	}
}
