package reservation_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
)

// saddGate holds the first SADD sent through a client (the listing of the
// SKU for the consumers and the restart check) until released.
type saddGate struct {
	once    sync.Once
	reached chan struct{}
	release chan struct{}
}

func (g *saddGate) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *saddGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (g *saddGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "sadd" {
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
	gate := &saddGate{reached: make(chan struct{}), release: make(chan struct{})}
	adminRDB := redis.NewClient(&redis.Options{Addr: s.redis.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	adminRDB.AddHook(gate)
	t.Cleanup(func() { _ = adminRDB.Close() })
	admin := inventory.NewReserved(reservation.New(adminRDB, s.db), s.db)
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
	listed, err := s.rdb.SIsMember(context.Background(), "stock:reserve:skus", sku).Result()
	if err != nil || !listed {
		t.Fatalf("after StartSale the SKU is listed: %v %v", listed, err)
	}
	if _, err := s.order(sku, 1, "buyer", ""); err != nil {
		t.Fatalf("order after StartSale: %v", err)
	}
}

// failSAdd fails every SADD sent through a client, as a connection that
// breaks right after Load's script answered does.
type failSAdd struct{}

func (failSAdd) DialHook(next redis.DialHook) redis.DialHook { return next }
func (failSAdd) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (failSAdd) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "sadd" {
			return errors.New("read tcp: connection reset by peer (test)")
		}
		return next(ctx, cmd)
	}
}

// listings counts the SMEMBERS a consumer sends (its listing of the SKUs
// on sale, once a second).
type listings struct{ *counter }

func (l listings) DialHook(next redis.DialHook) redis.DialHook { return next }
func (l listings) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (l listings) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "smembers" {
			l.add(1)
		}
		return err
	}
}

// TestFailedListingLeavesTheSaleClosed: listing the SKU for the consumers
// (reserve:skus) fails. The sale must not be open: were it, only a process
// that took an order of the SKU would read its stream, and an order
// answered 201 by an instance that then died would never be written. (Found
// by review, when the listing came after the load: StartSale failed, yet
// the sale sold, and a live consumer in another process never saw it.)
func TestFailedListingLeavesTheSaleClosed(t *testing.T) {
	s := newSale(t, "postgres") // instance B: takes orders, runs no consumer (dead)
	const sku = "review2-failed-load"
	ctx := context.Background()

	adminRDB := redis.NewClient(&redis.Options{Addr: s.redis.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	adminRDB.AddHook(failSAdd{})
	t.Cleanup(func() { _ = adminRDB.Close() })
	startErr := inventory.NewReserved(reservation.New(adminRDB, s.db), s.db).StartSale(ctx, sku, 5)
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
	c := reservation.New(crdb, s.db).NewConsumer(s.db, reservation.WithConsumerObserver(seen), reservation.WithClaimIdle(time.Millisecond))
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(cctx) }()
	t.Cleanup(func() { cancel(); <-done })
	lst.waitFor(t, 3, "listings of the SKUs") // a second apart: the SKU is never among them

	_, found, err := s.db.FindOrder(ctx, o.ID)
	if err != nil {
		t.Fatal(err)
	}
	pending, _ := s.rdb.XLen(ctx, "stock:{"+sku+"}:orders").Result()
	if !found {
		t.Errorf("order %s answered 201 is not in the database after the live consumer's three listings of the SKUs; %d entries wait unread in its stream and nothing lists it (StartSale said: %v)", o.ID, pending, startErr)
	}
}
