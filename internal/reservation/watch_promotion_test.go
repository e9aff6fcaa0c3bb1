package reservation_test

import (
	"context"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testredis"
)

// promoteAfterRead runs promote once, right after the first pipeline that
// reads INFO (a redis-watch attempt's read) has been answered, before the
// attempt goes on to MULTI/EXEC.
type promoteAfterRead struct {
	once    sync.Once
	promote func()
	fired   bool
}

func (h *promoteAfterRead) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *promoteAfterRead) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (h *promoteAfterRead) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if c.Name() == "info" {
				h.once.Do(func() { h.promote(); h.fired = true })
				break
			}
		}
		return err
	}
}

// TestWatchOrderReadOnAReplicaPromotedBeforeExecIsChecked: a failover moves
// the address the service dials (a VIP, a DNS name) to a replica that
// lagged, and promotes it. An optimistic order (redis-watch) sends its WATCH
// and read while the server is still a replica, and its MULTI/EXEC after the
// promotion. The read finds the replica's replication id (its master's:
// the one the sale was checked under), and the promotion touches no
// watched key (checked on Redis 7.0.15: WATCH on a replica, REPLICAOF NO
// ONE, MULTI/SET/EXEC applies), so EXEC sells units the database already
// holds as sold. (Before b2471ce, the same read asked SCRIPT EXISTS: a
// replica that never was master has no script, since Redis 7.0 replicates
// none, and the order had the SKU checked instead.)
//
//	P master, Q its replica through a link; sale 5 units on P, Q in sync
//	the link is cut (Q lags); on P: order 5 units, written (5 of 5 sold)
//	order on Q (redis-watch): WATCH, read (Q a replica: replid = P's = the sale's)
//	Q promoted (REPLICAOF NO ONE); MULTI/EXEC on Q applies: 201. The database: 10 units of 5
func TestWatchOrderReadOnAReplicaPromotedBeforeExecIsChecked(t *testing.T) {
	base := newSale(t, "postgres") // P
	const sku = "watch-promoted"
	ctx := context.Background()
	q, qc, a := laggingReplica(t, base, sku)

	hook := &promoteAfterRead{promote: func() {
		if err := qc.ReplicaOf(ctx, "NO", "ONE").Err(); err != nil {
			t.Error(err)
		}
	}}
	wrdb := redis.NewClient(&redis.Options{Addr: q.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	wrdb.AddHook(hook)
	t.Cleanup(func() { _ = wrdb.Close() })
	res := reservation.New(wrdb, base.db, reservation.WithOptimisticTransactions(50, 2))
	svc := sales.NewService(base.db, reservation.NewReserved(res, base.db, reservation.WithReservedName(strategies.NameRedisWatch)))

	o, err := svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 5, UserID: "on-q"})
	if !hook.fired {
		t.Fatalf("no read reached Q before the order ended (%v): the test did not run its schedule", err)
	}
	if err != nil {
		t.Logf("order on Q across its promotion: %v (refused: correct)", err)
		return
	}
	n, werr := res.NewConsumer(base.db).WriteOnce(ctx, sku)
	db, aerr := base.db.Audit(ctx, sku)
	if aerr != nil {
		t.Fatal(aerr)
	}
	t.Fatalf("order %s answered 201 on a lagging replica promoted between its read and its EXEC (order %s on P had taken those 5 units); written by Q's consumer: %d %v; the database: %d orders for %d units of a %d-unit sale (available %d)",
		o.ID, a.ID, n, werr, db.Orders, db.Ordered, db.Initial, db.Available)
}

// TestWritableReplicaNeverSellsUnchecked: the address the service dials is
// moved to a replica that lagged before (or without) its promotion, and the
// replica accepts writes (replica-read-only no). Its replication id is its
// master's, the one every sale was checked under, so the reserve script and
// the optimistic read both find the sale checked, and the replica sells
// units the database holds as sold. (Before b2471ce, a replica that never
// was master had no reserve script, NOSCRIPT had every SKU checked, and the
// check closed the sale.)
//
//	P master, Q its replica (replica-read-only no) through a link; sale 5 units on P, Q in sync
//	the link is cut (Q lags); on P: order 5 units, written (5 of 5 sold)
//	the service dials Q: order 5 units: 201. The database: 10 units of 5
func TestWritableReplicaNeverSellsUnchecked(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		base := newSale(t, "postgres") // P
		const sku = "writable-replica"
		ctx := context.Background()
		_, qc, a := laggingReplica(t, base, sku, "--replica-read-only", "no")

		res := reservation.New(qc, base.db, m.opts...)
		svc := sales.NewService(base.db, reservation.NewReserved(res, base.db, reservation.WithReservedName(m.name)))
		o, err := svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 5, UserID: "on-q"})
		if err != nil {
			t.Logf("order on the replica: %v (refused: correct)", err)
			return
		}
		n, werr := res.NewConsumer(base.db).WriteOnce(ctx, sku)
		db, aerr := base.db.Audit(ctx, sku)
		if aerr != nil {
			t.Fatal(aerr)
		}
		t.Fatalf("order %s answered 201 by a lagging replica (order %s on P had taken those 5 units); written from Q: %d %v; the database: %d orders for %d units of a %d-unit sale (available %d)",
			o.ID, a.ID, n, werr, db.Orders, db.Ordered, db.Initial, db.Available)
	})
}

// laggingReplica starts Q, a durable replica of base's Redis (P) through a
// link, puts sku on sale with 5 units, waits until Q has it, cuts the link
// (Q lags from here on) and sells the 5 units on P, written to the
// database. It returns Q, a client of Q, and P's order.
func laggingReplica(t *testing.T, base *sale, sku string, args ...string) (*testredis.Server, *redis.Client, inventory.Order) {
	t.Helper()
	ctx := context.Background()
	q := testredis.StartDurable(t, args...)
	base.consume(base.db)

	qc := redis.NewClient(&redis.Options{Addr: q.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = qc.Close() })
	link := startLink(t, base.redis.Addr)
	lh, lp := hostPort(t, link.Addr())
	if err := qc.ReplicaOf(ctx, lh, lp).Err(); err != nil {
		t.Fatal(err)
	}
	base.start(sku, 5)
	waitReplica(t, base.rdb)

	link.cut.Store(true)
	a, err := base.order(sku, 5, "on-p", "")
	if err != nil {
		t.Fatal(err)
	}
	base.drained(sku, 1)
	return q, qc, a
}
