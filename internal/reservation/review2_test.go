package reservation_test

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/testredis"
)

// Second review of redis-reserve: interleavings around the check of a
// restarted Redis (checkRestarted).

// redisDir is the data folder of the test's Redis.
func redisDir(t *testing.T, s *sale) string {
	t.Helper()
	dirs, err := s.rdb.ConfigGet(context.Background(), "dir").Result()
	if err != nil {
		t.Fatal(err)
	}
	return dirs["dir"]
}

// snapshot takes a consistent copy of a durable Redis's data (as a backup
// or a replica would hold it) and returns its folder.
func snapshot(t *testing.T, srv *testredis.Server, dir string) string {
	t.Helper()
	backup := t.TempDir()
	srv.Stop()
	copyDir(t, dir, backup)
	srv.Restart(t)
	return backup
}

// restoreCopy brings srv back with the data of backup: a restored backup,
// a failover to a replica that lagged.
func restoreCopy(t *testing.T, srv *testredis.Server, dir, backup string) {
	t.Helper()
	srv.Stop()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	copyDir(t, backup, dir)
	srv.Restart(t)
}

// holdFirstSink is the real database as a Sink whose first batch is held
// after the consumer read it from Redis and before it is written: held
// reports the batch, release lets it go on.
type holdFirstSink struct {
	reservation.Sink
	once    sync.Once
	held    chan []inventory.Order
	release chan struct{}
}

func (h *holdFirstSink) PersistReserved(ctx context.Context, sku string, epoch int64, orders []inventory.Order, keys []inventory.IdempotencyRecord) (int, error) {
	first := false
	h.once.Do(func() { first = true })
	if first {
		h.held <- append([]inventory.Order(nil), orders...)
		<-h.release
	}
	return h.Sink.PersistReserved(ctx, sku, epoch, orders, keys)
}

// TestReview2CheckRacesABatchInFlight: checkRestarted compares the
// database with a Redis that came back from an older copy while a consumer
// holds a batch it read from the Redis before the rollback. The database
// is not ahead yet, so the sale stays open and the script is loaded; then
// the batch commits (its sale is still the database's current one) and the
// database is ahead after all, while Redis sells the same units again.
//
//	copy of Redis: sale 1 loaded, 5 units, no order
//	order A (5 units) 201; the consumer reads A and is held before its commit
//	Redis comes back from the copy (5 units, no order)
//	order B: NOSCRIPT, check: database 0 orders, Redis 0: OK, script loaded; B 201
//	the consumer commits A (sale 1 is current), then B: 10 units of 5
func TestReview2CheckRacesABatchInFlight(t *testing.T) {
	s := newSale(t, "postgres")
	const sku = "review2-inflight"
	s.start(sku, 5)
	dir := redisDir(t, s)
	backup := snapshot(t, s.redis, dir)

	sink := &holdFirstSink{Sink: s.db, held: make(chan []inventory.Order, 1), release: make(chan struct{})}
	s.consume(sink)
	a, err := s.order(sku, 5, "first", "")
	if err != nil {
		t.Fatal(err)
	}
	batch := <-sink.held
	if len(batch) != 1 || batch[0].ID != a.ID {
		t.Fatalf("held batch %+v, want order %s", batch, a.ID)
	}

	restoreCopy(t, s.redis, dir, backup)

	b, errB := s.order(sku, 5, "second", "")
	close(sink.release)
	if errB != nil {
		t.Logf("order B after the rollback: %v (the sale was closed: correct)", errB)
		return
	}
	db := s.drained(sku, 2)
	t.Logf("orders %s and %s both answered 201 for 5 units each; the database: %+v", a.ID, b.ID, db)
	if db.Ordered > db.Initial || db.Available < 0 {
		t.Errorf("oversold: the database has %d orders for %d units of a %d-unit sale (available %d)", db.Orders, db.Ordered, db.Initial, db.Available)
	}
	audit, err := s.svc.Audit(context.Background(), sku)
	t.Logf("audit afterwards: %+v %v", audit, err)
}

// saddGate holds the first SADD sent through a client (Load's listing of
// the SKU for the consumers and the check) until released.
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

// TestReview2SaleOpenBeforeItIsListedEscapesTheCheck: Load opens the sale
// (loadScript) and only then lists the SKU in reserve:skus, the set the
// check of a restarted Redis walks. A copy of Redis taken between the two
// has the sale open and the SKU unlisted; orders taken meanwhile are
// written to the database; restored from that copy, Redis is "checked"
// without looking at the SKU, and sells its units again. The StartSale
// itself succeeds.
//
//	admin: StartSale: database sale 1, close, loadScript(1) ... (slow) ...
//	copy of Redis: sale 1 open with 5 units, SKU not in reserve:skus
//	order A (5 units) 201, written to the database
//	admin: SADD reserve:skus; StartSale returns nil
//	Redis comes back from the copy
//	order B: NOSCRIPT, check walks reserve:skus (empty): script loaded; B 201
//	database: 10 units of 5
func TestReview2SaleOpenBeforeItIsListedEscapesTheCheck(t *testing.T) {
	s := newSale(t, "postgres")
	const sku = "review2-unlisted"
	s.consume(s.db)
	dir := redisDir(t, s)

	gate := &saddGate{reached: make(chan struct{}), release: make(chan struct{})}
	adminRDB := redis.NewClient(&redis.Options{Addr: s.redis.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	adminRDB.AddHook(gate)
	t.Cleanup(func() { _ = adminRDB.Close() })
	admin := inventory.NewReserved(reservation.New(adminRDB, s.db), s.db)
	started := make(chan error, 1)
	go func() { started <- admin.StartSale(context.Background(), sku, 5) }()
	<-gate.reached // the sale is open in Redis, the SKU not listed yet

	backup := snapshot(t, s.redis, dir)

	a, err := s.order(sku, 5, "first", "")
	if err != nil {
		t.Fatal(err)
	}
	s.drained(sku, 1)
	close(gate.release)
	if err := <-started; err != nil {
		t.Fatalf("StartSale: %v (the test needs it to succeed)", err)
	}

	restoreCopy(t, s.redis, dir, backup)

	b, err := s.order(sku, 5, "second", "")
	if err != nil {
		t.Logf("order B after the rollback: %v (the sale was closed: correct)", err)
		return
	}
	db := s.drained(sku, 2)
	t.Logf("orders %s and %s both answered 201 for 5 units each; the database: %+v", a.ID, b.ID, db)
	if db.Ordered > db.Initial || db.Available < 0 {
		t.Errorf("oversold: the database has %d orders for %d units of a %d-unit sale (available %d)", db.Orders, db.Ordered, db.Initial, db.Available)
	}
}

// instance is one service instance whose Redis client dials addr.
func instance(t *testing.T, base *sale, addr string, seen *written) (*sale, func()) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	res := reservation.New(rdb, base.db)
	in := &sale{t: t, redis: base.redis, rdb: rdb, db: base.db, res: res,
		svc: inventory.NewService(base.db, inventory.NewReserved(res, base.db)), seen: seen}
	c := res.NewConsumer(base.db, reservation.WithConsumerObserver(seen))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return in, stop
}

func hostPort(t *testing.T, addr string) (string, string) {
	t.Helper()
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := strconv.Atoi(p); err != nil {
		t.Fatal(err)
	}
	return h, p
}

// waitReplica waits (WAIT, not a sleep) until master's one replica has
// everything master wrote so far.
func waitReplica(t *testing.T, master *redis.Client) {
	t.Helper()
	n, err := master.Wait(context.Background(), 1, 30*time.Second).Result()
	if err != nil || n != 1 {
		t.Fatalf("WAIT for the replica: %d %v", n, err)
	}
}

// replLink is a TCP relay between a replica and its master: once cut, what
// the master sends is dropped (a replica that lags, then loses its master).
type replLink struct {
	ln     net.Listener
	target string
	cut    atomic.Bool
}

func startLink(t *testing.T, target string) *replLink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &replLink{ln: ln, target: target}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go l.relay(c)
		}
	}()
	return l
}

func (l *replLink) Addr() string { return l.ln.Addr().String() }

func (l *replLink) relay(c net.Conn) {
	defer c.Close()
	u, err := net.Dial("tcp", l.target)
	if err != nil {
		return
	}
	defer u.Close()
	go func() { _, _ = io.Copy(u, c); _ = u.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := u.Read(buf)
		if n > 0 && !l.cut.Load() {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestReview2FailoverBackToALaggingReplicaKeepsTheScript: a Redis's script
// cache survives REPLICAOF: a server that was master once (the reserve
// script loaded), then a replica that lagged, then promoted again, has the
// older data and the script. No NOSCRIPT, no check: it sells again units
// the database has orders for. (Redis 7.0: restarts drop the script cache,
// a full or partial resync does not; SCRIPT LOAD is not replicated.)
//
//	P master: sale 1, 5 units; order 1 unit (script loaded on P); Q replica of P, in sync
//	failover: Q promoted, P replica of Q; order 1 unit on Q (NOSCRIPT, checked); P in sync
//	P lags (its link to Q cut); order 3 units on Q, written to the database (5 of 5 sold)
//	Q dies; failover back to P (REPLICAOF NO ONE): P has 3 units left and its script
//	order 3 units on P: 201. Database: 8 units of 5
func TestReview2FailoverBackToALaggingReplicaKeepsTheScript(t *testing.T) {
	base := newSale(t, "postgres")
	const sku = "review2-failover"
	ctx := context.Background()
	p := base.redis
	q := testredis.StartDurable(t)
	seen := newWritten()

	a, stopA := instance(t, base, p.Addr, seen)
	pc := a.rdb
	qc := redis.NewClient(&redis.Options{Addr: q.Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = qc.Close() })
	ph, pp := hostPort(t, p.Addr)
	if err := qc.SlaveOf(ctx, ph, pp).Err(); err != nil {
		t.Fatal(err)
	}
	a.start(sku, 5)
	if _, err := a.order(sku, 1, "on-p", ""); err != nil {
		t.Fatal(err)
	}
	a.drained(sku, 1)
	waitReplica(t, pc)
	stopA()

	// Failover 1: Q is promoted, P follows it.
	if err := qc.SlaveOf(ctx, "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	link := startLink(t, q.Addr)
	qh, qp := hostPort(t, link.Addr())
	if err := pc.SlaveOf(ctx, qh, qp).Err(); err != nil {
		t.Fatal(err)
	}
	b, stopB := instance(t, base, q.Addr, seen)
	if _, err := b.order(sku, 1, "on-q", ""); err != nil {
		t.Fatal(err)
	}
	b.drained(sku, 2)
	waitReplica(t, qc)

	// P lags behind Q (an asynchronous replica): these orders never reach it.
	link.cut.Store(true)
	if _, err := b.order(sku, 3, "lost-on-p", ""); err != nil {
		t.Fatal(err)
	}
	b.drained(sku, 3)
	stopB()

	// Q dies; failover back to P.
	q.Stop()
	pc2 := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = pc2.Close() })
	if err := pc2.SlaveOf(ctx, "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	c, _ := instance(t, base, p.Addr, seen)
	tally, err := c.res.Tally(ctx, sku)
	t.Logf("P after the failover back: %+v %v", tally, err)

	o, err := c.order(sku, 3, "sold-again", "")
	if err != nil {
		t.Logf("order on P after the failover back: %v (the sale was closed: correct)", err)
		return
	}
	db := c.drained(sku, 4)
	t.Logf("order %s answered 201 on P; the database: %+v", o.ID, db)
	if db.Ordered > db.Initial || db.Available < 0 {
		t.Errorf("oversold: the database has %d orders for %d units of a %d-unit sale (available %d)", db.Orders, db.Ordered, db.Initial, db.Available)
	}
}
