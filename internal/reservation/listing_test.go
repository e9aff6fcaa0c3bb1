package reservation_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/reservation"
)

// zaddGate holds the first ZADD sent through a client (the listing of the
// SKU in the catalog) until released.
type zaddGate struct {
	once    sync.Once
	reached chan struct{}
	release chan struct{}
}

func (g *zaddGate) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *zaddGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (g *zaddGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "zadd" {
			first := false
			g.once.Do(func() { first = true })
			if first {
				g.reached <- struct{}{}
				<-g.release
			}
		}
		return next(ctx, cmd)
	}
}

// TestSaleIsListedBeforeItOpens: while StartSale's listing of the SKU is
// held, the sale is not open (no order is taken), and once StartSale
// returns the SKU is listed. (Found by review, when the listing came after
// the load: a copy of Redis taken in between had the sale open and the SKU
// unlisted, so a Redis restored from it was "checked" without looking at
// the SKU and sold its units again.)
func TestSaleIsListedBeforeItOpens(t *testing.T) {
	s := newSale(t, "postgres")
	const sku = "listed-first"
	gate := &zaddGate{reached: make(chan struct{}), release: make(chan struct{})}
	adminRDB := redis.NewClient(&redis.Options{Addr: s.redis.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	adminRDB.AddHook(gate)
	t.Cleanup(func() { _ = adminRDB.Close() })
	admin := reservation.NewReserved(reservation.New(adminRDB, s.db), s.db)
	started := make(chan error, 1)
	go func() { started <- admin.StartSale(context.Background(), sku, 5) }()
	<-gate.reached
	if o, err := s.order(sku, 1, "early", ""); err == nil {
		t.Errorf("order %s taken before the SKU was listed", o.ID)
	}
	close(gate.release)
	if err := <-started; err != nil {
		t.Fatalf("StartSale: %v", err)
	}
	if _, err := s.rdb.ZScore(context.Background(), "stock:reserve:catalog", sku).Result(); err != nil {
		t.Fatalf("after StartSale the SKU is listed in the catalog: %v", err)
	}
	if _, err := s.order(sku, 1, "buyer", ""); err != nil {
		t.Fatalf("order after StartSale: %v", err)
	}
}

// failZAdd fails every ZADD sent through a client (the listing in the
// catalog), as a connection that breaks right then does.
type failZAdd struct{}

func (failZAdd) DialHook(next redis.DialHook) redis.DialHook { return next }
func (failZAdd) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (failZAdd) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "zadd" {
			return errors.New("read tcp: connection reset by peer (test)")
		}
		return next(ctx, cmd)
	}
}

// listings counts the catalog pages a consumer reads (its sweeps).
type listings struct{ *counter }

func (l listings) DialHook(next redis.DialHook) redis.DialHook { return next }
func (l listings) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (l listings) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "zscan" {
			l.add(1)
		}
		return err
	}
}

// TestFailedListingLeavesTheSaleClosed: listing the SKU for the consumers
// (reserve:catalog) fails. The sale must not be open: were it, only a process
// that took an order of the SKU would read its stream, and an order
// answered 201 by an instance that then died would never be written. (Found
// by review, when the listing came after the load: StartSale failed, yet
// the sale sold, and a live consumer in another process never saw it.)
func TestFailedListingLeavesTheSaleClosed(t *testing.T) {
	s := newSale(t, "postgres") // instance B: takes orders, runs no consumer (dead)
	const sku = "review2-failed-load"
	ctx := context.Background()

	adminRDB := redis.NewClient(&redis.Options{Addr: s.redis.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	adminRDB.AddHook(failZAdd{})
	t.Cleanup(func() { _ = adminRDB.Close() })
	startErr := reservation.NewReserved(reservation.New(adminRDB, s.db), s.db).StartSale(ctx, sku, 5)
	if startErr == nil {
		t.Fatal("StartSale succeeded although the listing failed")
	}
	t.Logf("StartSale: %v", startErr)

	o, err := s.order(sku, 2, "buyer", "")
	if err != nil {
		t.Logf("order after the failed StartSale: %v (the SKU is closed)", err)
		return
	}
	t.Errorf("order %s answered 201 although StartSale failed", o.ID)

	// Instance C: a live consumer in another process.
	lst := listings{newCounter()}
	crdb := redis.NewClient(&redis.Options{Addr: s.redis.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	crdb.AddHook(lst)
	t.Cleanup(func() { _ = crdb.Close() })
	seen := newWritten()
	c := reservation.New(crdb, s.db).NewConsumer(s.db, reservation.WithConsumerObserver(seen), reservation.WithClaimIdle(time.Millisecond), reservation.WithSweep(20*time.Millisecond))
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(cctx) }()
	t.Cleanup(func() { cancel(); <-done })
	lst.waitFor(t, 3, "sweeps of the catalog") // the SKU is never among them

	_, found, err := s.db.FindOrder(ctx, o.ID)
	if err != nil {
		t.Fatal(err)
	}
	pending, _ := s.rdb.XLen(ctx, "stock:{"+sku+"}:orders").Result()
	if !found {
		t.Errorf("order %s answered 201 is not in the database after the live consumer's three listings of the SKUs; %d entries wait unread in its stream and nothing lists it (StartSale said: %v)", o.ID, pending, startErr)
	}
}
