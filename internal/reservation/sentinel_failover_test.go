package reservation_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/backoff"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/redisconn"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/lab/testdb"
	"github.com/flashsale/stock/lab/testproxy"
	"github.com/flashsale/stock/lab/testredis"
)

// replicatedSale is a sale over a Redis primary, its replica and three
// Sentinels, reached as the service reaches it under REDIS_MODE=sentinel.
type replicatedSale struct {
	*sale
	redis *testredis.Replicated
}

func newReplicatedSale(t *testing.T, engine string, m mode, opts ...reservation.Option) *replicatedSale {
	t.Helper()
	return newReplicatedSaleWith(t, engine, m, testredis.SentinelOptions{}, opts...)
}

func newReplicatedSaleWith(t *testing.T, engine string, m mode, so testredis.SentinelOptions, opts ...reservation.Option) *replicatedSale {
	t.Helper()
	r := testredis.StartReplicated(t, so)
	rdb := redis.NewFailoverClient(redisconn.FailoverOptions(testredis.MasterName, r.Addrs()))
	t.Cleanup(func() { _ = rdb.Close() })
	db := testdb.New(t, engine, 8)
	res := reservation.New(rdb, db, append(opts, m.opts...)...)
	return &replicatedSale{redis: r, sale: &sale{t: t, rdb: rdb, db: db, res: res,
		svc: sales.NewService(db, reservation.NewReserved(res, db, reservation.WithReservedName(m.name))), seen: newWritten()}}
}

// instance is another instance of the service over the same Redis and
// database, with a client of its own.
func (s *replicatedSale) instance(t *testing.T, m mode, opts ...reservation.Option) *sales.Service {
	t.Helper()
	rdb := redis.NewFailoverClient(redisconn.FailoverOptions(testredis.MasterName, s.redis.Addrs()))
	t.Cleanup(func() { _ = rdb.Close() })
	res := reservation.New(rdb, s.db, append(opts, m.opts...)...)
	return sales.NewService(s.db, reservation.NewReserved(res, s.db, reservation.WithReservedName(m.name)))
}

// failOver kills the primary (kill -9) and returns once the Sentinels
// have promoted the replica and it answers as the primary.
func (s *replicatedSale) failOver() {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old, err := s.redis.Master(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	promoted := s.redis.WatchFailover(s.t, old)
	old.Stop()
	if _, err := promoted(ctx); err != nil {
		s.t.Fatal(err)
	}
}

// orderAfterFailover places an order, trying again for up to 20 s while
// it is answered 503: the client still finds the old primary's
// connections, or the new primary has no replica online yet (the other
// replica resynchronises from it).
func (s *replicatedSale) orderAfterFailover(sku, user string) inventory.Order {
	s.t.Helper()
	var last error
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for attempt := 0; ; attempt++ {
		o, err := s.order(sku, 1, user, "after-"+user)
		if err == nil {
			return o
		}
		if !errors.Is(err, inventory.ErrUnavailable) {
			s.t.Fatalf("order after the failover: %v", err)
		}
		last = err
		if backoff.Wait(ctx, backoff.Exponential(attempt, 10*time.Millisecond, 200*time.Millisecond)) != nil {
			s.t.Fatalf("no order taken within 20s of the failover; the last answer: %v", last)
		}
	}
}

// The sale's start waits for the replicas too (found by the review of
// stop 46). Without WAIT, a start answered while the replicas lag is lost
// with the primary: the promoted replica holds no sale, and every order
// is refused (503, not loaded) until the sale is started again: the
// control. With RESERVE_WAIT_REPLICAS the start is answered 503 while they
// lag (nothing the database recorded: the close before its commit waited
// too), its retry with the same key starts it once they have it, a retry
// of a start loaded on the primary alone waits for them again, and after
// a failover the promoted replica sells it.
func TestASaleStartIsAnsweredOnlyOnceItsReplicasHaveIt(t *testing.T) {
	for _, replicas := range []int{0, 1} {
		t.Run(fmt.Sprint("wait-replicas=", replicas), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			l := newLaggingSale(t, modes[0], reservation.WithReplicas(replicas, 200*time.Millisecond))
			req := inventory.SaleRequest{SKU: "sku", Available: 10, IdempotencyKey: "start-1"}
			l.links.Freeze()
			_, err := l.svc.OpenSale(ctx, req)
			if replicas == 0 {
				if err != nil {
					t.Fatalf("the control's start while the replicas lag: %v", err)
				}
				l.failOverLagging()
				if err := l.refusedNotLoaded("sku"); err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, inventory.ErrUnavailable) {
				t.Fatalf("a start while the replicas lag: %v, want 503 (unavailable)", err)
			}
			if a, err := l.db.Audit(ctx, "sku"); err == nil && a.Sale != 0 {
				t.Fatalf("the database recorded sale %d of a start answered 503 before its commit", a.Sale)
			}
			l.links.Thaw()
			if _, err := l.svc.OpenSale(ctx, req); err != nil {
				t.Fatalf("its retry once the replicas have it: %v", err)
			}
			// A retry that finds the sale loaded waits for the replicas:
			// the first attempt may have been answered 503 for them alone.
			l.links.Freeze()
			if _, err := l.svc.OpenSale(ctx, req); !errors.Is(err, inventory.ErrUnavailable) {
				t.Fatalf("a retry of the start while the replicas lag: %v, want 503 (unavailable)", err)
			}
			l.links.Thaw()
			l.consume(l.db)
			l.failOverLagging()
			l.orderAfterFailover("sku", "after")
			if a := waitWritten(t, l.sale, "sku", 1); a.Orders != 1 || a.Available != 9 {
				t.Fatalf("after the failover the database has %+v, want the one order, 9 left", a)
			}
		})
	}
}

// refusedNotLoaded returns nil once an order of sku is refused because
// the store holds no sale (the client may first meet the old primary's
// connections), an error if one is taken or 20 s pass.
func (s *replicatedSale) refusedNotLoaded(sku string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for attempt := 0; ; attempt++ {
		_, err := s.order(sku, 1, "after", fmt.Sprint("after-", attempt))
		switch {
		case err == nil:
			return fmt.Errorf("an order was taken after the failover: the control's start survived it")
		case errors.Is(err, reservation.ErrSaleNotLoaded):
			return nil
		case !errors.Is(err, inventory.ErrUnavailable):
			return fmt.Errorf("order after the failover: %w", err)
		}
		if backoff.Wait(ctx, backoff.Exponential(attempt, 10*time.Millisecond, 200*time.Millisecond)) != nil {
			return fmt.Errorf("no order refused as not loaded within 20s of the failover; the last answer: %w", err)
		}
	}
}

// The reason for RESERVE_WAIT_REPLICAS: orders answered 201 and still only
// in Redis (no consumer has written them) when the primary is killed are
// on the promoted replica, and reach the database.
func TestOrdersAnsweredBeforeAFailoverAreWrittenAfterIt(t *testing.T) {
	for _, engine := range []string{"postgres", "mysql"} {
		forEachMode(t, func(t *testing.T, m mode) {
			t.Run(engine, func(t *testing.T) {
				t.Parallel()
				s := newReplicatedSale(t, engine, m, reservation.WithReplicas(1, time.Second))
				s.start("sku", 10)
				var answered []string
				for i := range 5 {
					o, err := s.order("sku", 1, fmt.Sprint("before-", i), fmt.Sprint("key-", i))
					if err != nil {
						t.Fatalf("order %d before the failover: %v", i, err)
					}
					answered = append(answered, o.ID)
				}
				s.failOver()
				s.consume(s.db)
				after := s.orderAfterFailover("sku", "after")
				// The check of the sale on the new primary writes the
				// orders it finds in the stream; the consumer the rest.
				a := waitWritten(t, s.sale, "sku", 6)
				if a.Ordered != 6 || a.Orders != 6 || a.Available != 4 {
					t.Fatalf("after the failover the database has %+v, want the 5 orders answered before it and 1 after, 4 left", a)
				}
				for _, id := range append(answered, after.ID) {
					if _, found, err := s.db.FindOrder(context.Background(), id); !found || err != nil {
						t.Errorf("order %s answered 201 is not in the database (found %v, %v)", id, found, err)
					}
				}
			})
		})
	}
}

// laggingSale is a replicated sale whose replicas replicate through
// proxies, frozen to make them lag.
type laggingSale struct {
	*replicatedSale
	links testproxy.Group
}

func newLaggingSale(t *testing.T, m mode, opts ...reservation.Option) *laggingSale {
	t.Helper()
	return newLaggingSaleWith(t, m, testredis.SentinelOptions{}, opts...)
}

// newLaggingSaleWith is newLaggingSale with so's settings besides the
// links.
func newLaggingSaleWith(t *testing.T, m mode, so testredis.SentinelOptions, opts ...reservation.Option) *laggingSale {
	t.Helper()
	l := &laggingSale{}
	so.Link = func(primary string) (string, error) {
		p := testproxy.Start(t, primary)
		l.links = append(l.links, p)
		return p.Addr, nil
	}
	// The Sentinels leave a replica on its proxy this long.
	so.FailoverTimeout = time.Minute
	l.replicatedSale = newReplicatedSaleWith(t, "postgres", m, so, opts...)
	return l
}

// failOverLagging kills the primary while the replicas lag, drops what
// they had not received, and returns the replica promoted.
func (l *laggingSale) failOverLagging() *testredis.Server {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old, err := l.redis.Master(ctx)
	if err != nil {
		l.t.Fatal(err)
	}
	promoted := l.redis.WatchFailover(l.t, old)
	old.Stop()
	l.links.Cut() // what the proxies held is lost with the primary
	l.links.Thaw()
	m, err := promoted(ctx)
	if err != nil {
		l.t.Fatal(err)
	}
	return m
}

// The control and its fix: replicas that lag when the primary is lost.
// Without WAIT the orders the primary answered 201 are gone after the
// failover: nothing in Redis or the database remembers them, only their
// buyers' 201s. With RESERVE_WAIT_REPLICAS=1 the same orders are answered
// 503 (may have happened), no 201 is lost, and the consumer, running
// through the lag, writes none of them: the sale sells on after the
// failover.
func TestALaggingReplicaLosesOrdersAnswered201OnlyWithoutWait(t *testing.T) {
	for _, replicas := range []int{0, 1} {
		t.Run(fmt.Sprint("wait-replicas=", replicas), func(t *testing.T) {
			t.Parallel()
			l := newLaggingSale(t, modes[0], reservation.WithReplicas(replicas, 200*time.Millisecond))
			l.start("sku", 10)
			ctx := context.Background()
			// The sale's start is on the replicas before they lag.
			if n, err := l.rdb.Wait(ctx, 2, 2*time.Second).Result(); err != nil || n != 2 {
				t.Fatalf("WAIT: %d, %v", n, err)
			}
			if replicas > 0 {
				// The consumer runs through the lag: it must not write
				// what the replicas do not have, or the database would be
				// ahead of the promoted replica and the sale would close.
				l.consume(l.db)
			}
			l.links.Freeze()
			var answered []string
			for i := range 3 {
				o, err := l.order("sku", 1, fmt.Sprint("lagged-", i), fmt.Sprint("key-", i))
				switch {
				case err == nil:
					answered = append(answered, o.ID)
				case replicas == 0 || !errors.Is(err, inventory.ErrOutcomeUnknown):
					t.Fatalf("order %d while the replicas lag: %v", i, err)
				}
			}
			l.failOverLagging()
			if replicas == 0 {
				l.consume(l.db)
			}
			l.orderAfterFailover("sku", "after")
			if a := waitWritten(t, l.sale, "sku", 1); a.Orders != 1 {
				t.Fatalf("the database has %+v, want only the order after the failover", a)
			}
			var lost []string
			for _, id := range answered {
				if _, found, err := l.db.FindOrder(ctx, id); err != nil {
					t.Fatal(err)
				} else if !found {
					lost = append(lost, id)
				}
			}
			switch {
			case replicas == 0 && (len(answered) != 3 || len(lost) != 3):
				t.Fatalf("without WAIT: %d orders answered 201, %d of them lost; want 3 and 3 (the control)", len(answered), len(lost))
			case replicas == 1 && len(answered) != 0:
				t.Fatalf("with WAIT: %d orders answered 201 while no replica had them, want 0", len(answered))
			}
		})
	}
}

// An order its replicas have not confirmed in time is answered 503 (may
// have happened). Its retry through another instance, while they still
// lag, is 503 too: the retry finds the order taken and writes its answer
// again, so that its WAIT covers the order. (Redis 7.0, Debian's, moves a
// connection's WAIT offset after any command, so here the retry would
// wait without that write; Redis 7.2 and later only after a write, and a
// retry that wrote nothing would be answered at once.) Once the replicas
// have it, the retry gets the order.
func TestARetryGetsTheOrderOnceTheReplicasHaveIt(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		t.Parallel()
		opts := []reservation.Option{reservation.WithReplicas(1, 200*time.Millisecond)}
		l := newLaggingSale(t, m, opts...)
		other := l.instance(t, m, opts...)
		l.start("sku", 10)
		l.links.Freeze()
		if _, err := l.order("sku", 1, "a", "key-a"); !errors.Is(err, inventory.ErrOutcomeUnknown) {
			t.Fatalf("an order no replica confirmed: %v, want outcome unknown (503, may have happened)", err)
		}
		req := inventory.Request{SKU: "sku", Quantity: 1, UserID: "a", IdempotencyKey: "key-a"}
		if _, err := other.PlaceOrder(context.Background(), req); !errors.Is(err, inventory.ErrOutcomeUnknown) {
			t.Fatalf("its retry through another instance while the replicas lag: %v, want outcome unknown", err)
		}
		l.links.Thaw()
		retried, err := other.PlaceOrder(context.Background(), req)
		if err != nil {
			t.Fatalf("its retry once the replicas have it: %v", err)
		}
		l.consume(l.db)
		if a := waitWritten(t, l.sale, "sku", 1); a.Orders != 1 || a.Ordered != 1 {
			t.Fatalf("the database has %+v, want the one order", a)
		}
		if _, found, err := l.db.FindOrder(context.Background(), retried.ID); !found || err != nil {
			t.Fatalf("the retried order %s is not in the database (found %v, %v)", retried.ID, found, err)
		}
	})
}

// Found by review: WAIT for one replica of two does not decide which one
// Sentinel promotes (it goes by priority, then by the offsets it last
// read). Here the replica Sentinel prefers lags while the other confirms
// every order: waiting for n=1 answered them 201, and the promotion lost
// them. Waiting for every replica online answers them 503 instead.
func TestALaggingReplicaIsWaitedForEvenWithAnotherThatHasTheOrder(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		t.Parallel()
		l := newLaggingSaleWith(t, m, testredis.SentinelOptions{
			// A lower priority is preferred: the second replica.
			ReplicaArgs: [][]string{{"--replica-priority", "200"}, {"--replica-priority", "50"}},
		}, reservation.WithReplicas(1, 200*time.Millisecond))
		l.start("sku", 10)
		l.consume(l.db)
		var answered []string
		take := func(user string) {
			o, err := l.order("sku", 1, user, "key-"+user)
			switch {
			case err == nil:
				answered = append(answered, o.ID)
			case !errors.Is(err, inventory.ErrOutcomeUnknown):
				t.Fatalf("order of %s: %v", user, err)
			}
		}
		take("before")
		if len(answered) != 1 {
			t.Fatal("no order answered 201 before the lag")
		}
		l.links[1].Freeze() // only the preferred replica lags
		for i := range 3 {
			take(fmt.Sprint("lagged-", i))
		}
		if promoted := l.failOverLagging(); promoted != l.redis.Servers[2] {
			t.Fatalf("the Sentinels promoted %s, not the replica they prefer (%s): the test shows nothing", promoted.Addr, l.redis.Servers[2].Addr)
		}
		l.orderAfterFailover("sku", "after")
		waitWritten(t, l.sale, "sku", int64(len(answered))+1)
		for _, id := range answered {
			if _, found, err := l.db.FindOrder(context.Background(), id); !found || err != nil {
				t.Errorf("order %s answered 201 is not in the database after the failover (found %v, %v)", id, found, err)
			}
		}
	})
}

// A return needs no WAIT of its own: a cancel's units given back to a
// primary whose replicas lag are lost with it, and the check of the sale
// on the promoted replica (its first order) gives back every return the
// database has. Here the sale's one unit is ordered, cancelled while the
// replicas lag, and sold again after the failover.
func TestAReturnLostWithThePrimaryIsGivenBackByTheCheckAfterTheFailover(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		t.Parallel()
		ctx := context.Background()
		l := newLaggingSale(t, m, reservation.WithReplicas(1, 200*time.Millisecond))
		// Held orders, so that one can be cancelled.
		l.svc = sales.NewService(l.db, reservation.NewReserved(l.res, l.db, reservation.WithReservedName(m.name)), sales.WithHoldTTL(time.Hour))
		l.start("sku", 1)
		l.consume(l.db)
		a, err := l.order("sku", 1, "a", "key-a")
		if err != nil {
			t.Fatalf("the order before the lag: %v", err)
		}
		waitWritten(t, l.sale, "sku", 1)
		l.links.Freeze()
		if _, err := l.svc.CancelOrder(ctx, a.ID, "a"); err != nil {
			t.Fatalf("the cancel while the replicas lag: %v", err)
		}
		l.failOverLagging()
		l.orderAfterFailover("sku", "after")
	})
}

// Found by timing scenario 14: an order waits for as many replicas as
// the primary last counted online, and after a failover that count was
// the old primary's (two replicas; the promoted one has one). The first
// orders on the new primary, whose replies need no WAIT (NOSCRIPT: a
// promoted replica has no scripts; "unchecked": a new replication id),
// still sent one for two replicas and waited its timeout out, round after
// round: the sale sold again a second after the Sentinels announced the
// new primary, not at once. Now the orders refused while the primary is
// down, and a connection to another server, leave the count unknown, and
// every WAIT's INFO counts the replicas, whatever the reply. Here the
// timeout is longer than the order's deadline, so a stale count fails the
// order instead of slowing it.
func TestTheFirstOrderAfterAFailoverWaitsForTheNewPrimarysReplicasOnly(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		t.Parallel()
		s := newReplicatedSale(t, "postgres", m, reservation.WithReplicas(1, time.Minute))
		s.start("sku", 10)
		if _, err := s.order("sku", 1, "before", "key-before"); err != nil {
			t.Fatalf("the order before the failover (both replicas online): %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		old, err := s.redis.Master(ctx)
		if err != nil {
			t.Fatal(err)
		}
		promoted := s.redis.WatchFailover(t, old)
		old.Stop()
		// A buyer while the primary is down, as in any sale: refused.
		if _, err := s.order("sku", 1, "down", "key-down"); !errors.Is(err, inventory.ErrUnavailable) {
			t.Fatalf("an order while the primary is down: %v, want unavailable", err)
		}
		if _, err := promoted(ctx); err != nil {
			t.Fatal(err)
		}
		s.consume(s.db)
		// The other replica resynchronises from the promoted one: it has
		// no replica online, then one.
		octx, ocancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ocancel()
		req := inventory.Request{SKU: "sku", Quantity: 1, UserID: "after", IdempotencyKey: "key-after"}
		if _, err := s.svc.PlaceOrder(octx, req); err != nil {
			t.Fatalf("the first order on the new primary, within 5 s: %v (a WAIT for the old primary's two replicas waits its minute out)", err)
		}
		if a := waitWritten(t, s.sale, "sku", 2); a.Orders != 2 || a.Available != 8 {
			t.Fatalf("the database has %+v, want both orders, 8 left", a)
		}
	})
}

// A start's probe confirms what the server it reaches holds. Here the
// primary is lost between the start's load (on the primary alone, its
// replicas lagging) and its probe. Sent through the pool, the probe would
// reach the promoted replica, and its replica would confirm the probe,
// not the load the new primary never had. The start must be answered 503
// (may have happened), not started: the sale would refuse every order.
// Its retry with the same key starts it.
func TestAStartWhoseProbeReachesAPromotedReplicaIsNotConfirmed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newLaggingSale(t, modes[0], reservation.WithReplicas(1, 2*time.Second))
	hook := &aroundProbe{
		// The close's probe, confirmed by both replicas: then they lag.
		after: func(probe int) {
			if probe == 1 {
				l.links.Freeze()
			}
		},
		// The load's probe: the primary is lost first, with the load.
		before: func(probe int) {
			if probe == 2 {
				promoted := l.failOverLagging()
				waitOnlineReplica(t, promoted.Addr)
				waitClientOn(t, l.rdb, promoted.Addr)
			}
		},
	}
	l.rdb.AddHook(hook)
	req := inventory.SaleRequest{SKU: "sku", Available: 10, IdempotencyKey: "start-1"}
	// Through the pool the probe would reach the promoted replica, whose
	// replica confirms it (it is online before the probe is sent).
	if _, err := l.svc.OpenSale(ctx, req); !errors.Is(err, inventory.ErrUnavailable) {
		t.Fatalf("a start whose load was lost with the primary before its probe: %v, want 503 (unavailable)", err)
	}
	if n := hook.probes.Load(); n != 2 {
		t.Fatalf("the start sent %d probes, want 2 (the close's, the load's): the failover did not come between the load and its probe", n)
	}
	if _, err := l.svc.OpenSale(ctx, req); err != nil {
		t.Fatalf("its retry after the failover: %v", err)
	}
	l.consume(l.db)
	l.orderAfterFailover("sku", "after")
	if a := waitWritten(t, l.sale, "sku", 1); a.Orders != 1 || a.Available != 9 {
		t.Fatalf("after the failover the database has %+v, want the one order, 9 left", a)
	}
}

// aroundProbe is a client hook that calls before(n) and after(n) around
// the nth pipeline that carries the replicas' probe.
type aroundProbe struct {
	probes        atomic.Int32
	before, after func(n int)
}

func (h *aroundProbe) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *aroundProbe) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *aroundProbe) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !slices.ContainsFunc(cmds, isProbe) {
			return next(ctx, cmds)
		}
		n := int(h.probes.Add(1))
		h.before(n)
		err := next(ctx, cmds)
		h.after(n)
		return err
	}
}

// isProbe: the write a WAIT for the replicas follows (reserve:replicated).
func isProbe(c redis.Cmder) bool {
	args := c.Args()
	if len(args) < 2 || c.Name() != "set" {
		return false
	}
	key, ok := args[1].(string)
	return ok && strings.HasSuffix(key, "reserve:replicated")
}

// waitOnlineReplica waits, up to 30 s, until the server at addr counts a
// replica online (the other replica resynchronises from it).
func waitOnlineReplica(t *testing.T, addr string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for attempt := 0; ; attempt++ {
		if info, err := c.Info(ctx, "replication").Result(); err == nil && strings.Contains(info, ",state=online,") {
			return
		}
		if backoff.Wait(ctx, backoff.Exponential(attempt, 10*time.Millisecond, 200*time.Millisecond)) != nil {
			t.Fatalf("no replica online on the promoted %s within 30 s", addr)
		}
	}
}

// waitClientOn waits, up to 30 s, until rdb's commands reach the server
// at addr (the failover client learns of the switch from the Sentinels).
func waitClientOn(t *testing.T, rdb redis.UniversalClient, addr string) {
	t.Helper()
	_, port, _ := strings.Cut(addr, ":")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for attempt := 0; ; attempt++ {
		if info, err := rdb.Info(ctx, "server").Result(); err == nil && strings.Contains(info, "\ntcp_port:"+port+"\r") {
			return
		}
		if backoff.Wait(ctx, backoff.Exponential(attempt, 10*time.Millisecond, 200*time.Millisecond)) != nil {
			t.Fatalf("the client did not reach the promoted %s within 30 s", addr)
		}
	}
}
