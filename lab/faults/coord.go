package faults

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testetcd"
	"github.com/flashsale/stock/lab/testzk"
)

// ErrUnavailable means the service binary does not offer the run's
// strategy yet (zk-lock before it is wired into cmd/stock): the run is
// skipped, not failed.
var ErrUnavailable = errors.New("strategy not available in the service binary")

// The coordination services' key layout, as the service uses it: the
// lock of a SKU is named "sku:<sku>" (inventory), etcdlock queues its
// holders under "<prefix>q/<name>/" and zklock under "<prefix>/<name>",
// with their default prefixes.
const (
	etcdQueuePrefix = "/stock/locks/q/sku:"
	zkLockPrefix    = "/stock/locks/sku:"
)

func isCoordination(strategy string) bool {
	k := lockOf(strategy)
	return k == strategies.LockEtcd || k == strategies.LockZooKeeper
}

// lockOf is where strategy's lock lives, as its registry entry says ("":
// none).
func lockOf(strategy string) strategies.LockKind {
	info, _ := strategies.Lookup(strategy)
	return info.Lock
}

// coordinator is a coordination service the run started (an etcd cluster
// or a ZooKeeper ensemble), seen as members that can be killed and
// started again.
type coordinator interface {
	kind() string
	// env is the service's variable that names the members.
	env() string
	size() int
	memberName(i int) string
	// leader returns the index of the running member that leads, or an
	// error while none does.
	leader(ctx context.Context) (int, error)
	kill(i int)
	// start starts a killed member with its data and returns once it has
	// rejoined (it serves, which needs the others' quorum).
	start(i int) error
	close()
}

// startCoordinator starts the single etcd member or standalone ZooKeeper
// that strategy's instances use, and returns the variable that points them
// at it.
func (r *run) startCoordinator(strategy string) (string, error) {
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return "", err
	}
	start := r.startEtcd
	if lockOf(strategy) == strategies.LockZooKeeper {
		start = r.startZK
	}
	co, err := start(1)
	if err != nil {
		return "", err
	}
	return co.env(), nil
}

// startEtcd starts a private etcd cluster of n members for the run.
func (r *run) startEtcd(n int) (coordinator, error) {
	dir, err := os.MkdirTemp("", "faults-etcd-")
	if err != nil {
		return nil, err
	}
	c, err := testetcd.Spawn(dir, n)
	if err != nil {
		_ = os.RemoveAll(dir)
		if errors.Is(err, testetcd.ErrNoEtcd) {
			return nil, fmt.Errorf("%w: %w", ErrMissing, err)
		}
		return nil, err
	}
	co := &etcdCoord{c: c, dir: dir}
	r.coord = co
	r.cleanups = append(r.cleanups, co.close)
	return co, nil
}

// startZK starts a private ZooKeeper for the run: a standalone server for
// n == 1, else an ensemble of n members.
func (r *run) startZK(n int) (coordinator, error) {
	dir, err := os.MkdirTemp("", "faults-zk-")
	if err != nil {
		return nil, err
	}
	var e *testzk.Ensemble
	if n == 1 {
		var s *testzk.Server
		if s, err = testzk.Spawn(dir, 0); err == nil {
			e = &testzk.Ensemble{Members: []*testzk.Server{s}}
		}
	} else {
		e, err = testzk.SpawnEnsemble(dir, n)
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		if errors.Is(err, testzk.ErrNoZooKeeper) {
			return nil, fmt.Errorf("%w: %w", ErrMissing, err)
		}
		return nil, err
	}
	co := &zkCoord{e: e, dir: dir}
	r.coord = co
	r.cleanups = append(r.cleanups, co.close)
	return co, nil
}

type etcdCoord struct {
	c   *testetcd.Cluster
	dir string
}

func (c *etcdCoord) kind() string { return "etcd" }
func (c *etcdCoord) env() string {
	return "ETCD_ENDPOINTS=" + strings.Join(c.c.Endpoints(), ",")
}
func (c *etcdCoord) size() int { return len(c.c.Members) }
func (c *etcdCoord) memberName(i int) string {
	m := c.c.Members[i]
	if pid := m.PID(); pid != 0 {
		return fmt.Sprintf("%s (pid %d)", m.Name, pid)
	}
	return m.Name
}
func (c *etcdCoord) leader(ctx context.Context) (int, error) { return c.c.LeaderIndex(ctx) }
func (c *etcdCoord) kill(i int)                              { c.c.Members[i].Kill() }
func (c *etcdCoord) start(i int) error                       { return c.c.Members[i].Start() }
func (c *etcdCoord) close() {
	c.c.Stop()
	_ = os.RemoveAll(c.dir)
}

type zkCoord struct {
	e   *testzk.Ensemble
	dir string
}

func (c *zkCoord) kind() string { return "ZooKeeper" }
func (c *zkCoord) env() string  { return "ZK_SERVERS=" + strings.Join(c.e.Addrs(), ",") }
func (c *zkCoord) size() int    { return len(c.e.Members) }
func (c *zkCoord) memberName(i int) string {
	return fmt.Sprintf("server.%d on %s", i+1, c.e.Members[i].Addr)
}
func (c *zkCoord) leader(context.Context) (int, error) {
	if len(c.e.Members) == 1 {
		if c.e.Members[0].Running() {
			return 0, nil
		}
		return -1, errors.New("the ZooKeeper server is down")
	}
	// Members that are down refuse the connection at once (loopback).
	if i := c.e.Leader(); i >= 0 {
		return i, nil
	}
	return -1, errors.New("no ZooKeeper member leads")
}
func (c *zkCoord) kill(i int)        { c.e.Kill(i) }
func (c *zkCoord) start(i int) error { return c.e.Start(i) }
func (c *zkCoord) close() {
	c.e.Stop()
	_ = os.RemoveAll(c.dir)
}

// setUpErr turns an instance that refused to start because the binary does
// not offer the strategy (a binary older than its registry entry) into
// ErrUnavailable, which skips the run.
func setUpErr(strategy string, err error) error {
	if err != nil && strings.Contains(err.Error(), fmt.Sprintf("STRATEGY=%q is unknown", strategy)) {
		return fmt.Errorf("%w: the service binary does not know STRATEGY=%s: %w", ErrUnavailable, strategy, err)
	}
	return err
}

// holderState returns a description of who holds the lock of a SKU that
// changes whenever a new holder takes it (across processes, and inside one
// by a local hand-over); "" when nobody does. pauseHolder compares two
// reads taken while the instance is stopped.
type holderState func(ctx context.Context, sku string) (string, error)

// holderWatch returns the run's holderState, read from the lock service,
// and what closes it.
func (r *run) holderWatch(strategy string) (holderState, func(), error) {
	switch lockOf(strategy) {
	case strategies.LockEtcd:
		cli, err := clientv3.New(clientv3.Config{Endpoints: r.coord.(*etcdCoord).c.Endpoints(), DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context, sku string) (string, error) {
			return etcdHolder(ctx, cli, sku)
		}, func() { _ = cli.Close() }, nil
	case strategies.LockZooKeeper:
		conn, _, err := zk.Connect(r.coord.(*zkCoord).e.Addrs(), 5*time.Second, zk.WithLogger(log.New(io.Discard, "", 0)))
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context, sku string) (string, error) {
			return zkHolder(conn, sku)
		}, conn.Close, nil
	case strategies.LockTable:
		return r.tableHolderWatch()
	case strategies.LockGetset:
		// The old lock's value is its holder's expiry time: a new
		// holder writes a new one.
		rc := redis.NewClient(&redis.Options{Addr: r.redis[0].Addr, MaxRetries: -1})
		return func(ctx context.Context, sku string) (string, error) {
			return rc.Get(ctx, "legacy-lock:sku:"+sku).Result()
		}, func() { _ = rc.Close() }, nil
	default:
		// The first Redis server: redis-lock's, and one of redlock's.
		rc := redis.NewClient(&redis.Options{Addr: r.redis[0].Addr, MaxRetries: -1})
		return func(ctx context.Context, sku string) (string, error) {
			// locking's default prefix "lock:" and inventory's "sku:" key.
			return rc.Get(ctx, "lock:sku:"+sku).Result()
		}, func() { _ = rc.Close() }, nil
	}
}

// tableHolderWatch reads db-lock's holder from the lock table of the run's
// database: the live row's owner and token (a hand-over changes both).
func (r *run) tableHolderWatch() (holderState, func(), error) {
	const (
		pgHolder = `SELECT owner || '@' || token FROM stock_locks WHERE name = $1 AND owner IS NOT NULL AND expires_at > now()`
		myHolder = `SELECT CONCAT(owner, '@', token) FROM stock_locks WHERE name = ? AND owner IS NOT NULL AND expires_at > UTC_TIMESTAMP(6)`
	)
	if engineOf(r.dbURL) == "postgres" {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, r.dbURL)
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context, sku string) (string, error) {
			var holder string
			err := conn.QueryRow(ctx, pgHolder, "sku:"+sku).Scan(&holder)
			return holder, err
		}, func() { _ = conn.Close(context.Background()) }, nil
	}
	db, err := openMySQL(r.dbURL)
	if err != nil {
		return nil, nil, err
	}
	db.SetMaxOpenConns(1)
	return func(ctx context.Context, sku string) (string, error) {
		var holder string
		err := db.QueryRowContext(ctx, myHolder, "sku:"+sku).Scan(&holder)
		return holder, err
	}, func() { _ = db.Close() }, nil
}

// etcdHolder reads the oldest key of the SKU's etcdlock queue: its holder.
// The key is "<session lease id in hex>-<sequence>"; a local hand-over
// writes it again, so its mod revision tells the holders of one key apart.
func etcdHolder(ctx context.Context, cli *clientv3.Client, sku string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, etcdQueuePrefix+sku+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
	if err != nil {
		return "", err
	}
	if len(resp.Kvs) == 0 {
		return "", errors.New("nobody holds")
	}
	kv := resp.Kvs[0]
	return fmt.Sprintf("%s@%d", kv.Key, kv.ModRevision), nil
}

// zkHolder reads the lowest lock node of the SKU's zklock folder: its
// holder. Each new holder writes its node (its fencing token), so the
// node's mzxid tells the holders of one node apart.
func zkHolder(conn *zk.Conn, sku string) (string, error) {
	dir := zkLockPrefix + sku
	children, _, err := conn.Children(dir)
	if err != nil {
		return "", err
	}
	children = slices.DeleteFunc(children, func(c string) bool { return !strings.Contains(c, "-lock-") })
	if len(children) == 0 {
		return "", errors.New("nobody holds")
	}
	seq := func(c string) string { return c[strings.LastIndex(c, "-lock-"):] }
	lowest := slices.MinFunc(children, func(a, b string) int { return strings.Compare(seq(a), seq(b)) })
	_, st, err := conn.Get(dir + "/" + lowest)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s@%d", lowest, st.Mzxid), nil
}

// CoordinatorLeaderKill is scenario 7's leader kill: etcd-lock (or zk-lock)
// on PostgreSQL, three instances on a private three-member etcd cluster (or
// ZooKeeper ensemble). Under load, the leader is killed with SIGKILL; once
// another member leads, the load goes on for a while, and the killed
// member is started again with its data and must rejoin (serve a
// linearizable read through itself, or for ZooKeeper serve in a mode).
//
// Besides the checks of every run: no answer may come later than
// ORDER_TIMEOUT plus a slack of a second (a wait gives up at its own
// deadline, and a release's cleanup is bounded: etcd's own recipe stalled
// 5-8 s past the contexts here; a warning in the short form); the 201 rate
// in the seconds after the election is compared with the rate in as many
// seconds before the kill, with the share of 503s of each (reported); the
// 201s answered per 250 ms must come back to 80% of the rate before the
// kill within LOCK_WAIT + 1 s of the election (else a warning: degraded),
// and no 201 at all within 2 s of the election is a failure: the lock
// stalled.
func (e *Env) CoordinatorLeaderKill(ctx context.Context, strategy string) Result {
	d, rate := e.scale(16*time.Second, 6*time.Second), 150.0
	orderTimeout, lockWait, slack := 3*time.Second, 2*time.Second, time.Second
	ttl := 2 * time.Second
	cfg := Config{Engine: "postgres", Strategy: strategy, Safe: true, Instances: 3, Fencing: "on",
		LockTTL: ttl.String(), OrderTimeout: orderTimeout.String()}
	name, service := "7-etcd-leader-kill", "etcd cluster"
	zookeeper := lockOf(strategy) == strategies.LockZooKeeper
	if zookeeper {
		name, service = "7-zk-leader-kill", "ZooKeeper ensemble"
		cfg.ZKServers = 3
	} else {
		cfg.EtcdMembers = 3
	}
	r := e.newRun(7, name, fmt.Sprintf("%s: kill -9 of the leader of a three-member %s mid-load, then a restart of the member",
		strategy, service), cfg)
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return r.abort(err)
	}
	var co coordinator
	var err error
	if zookeeper {
		co, err = r.startZK(3)
	} else {
		co, err = r.startEtcd(3)
	}
	if err != nil {
		return r.abort(err)
	}
	if err := r.setUp(ctx, 0, co.env(), "FENCING=on", "LOCK_TTL="+ttl.String(), "LOCK_WAIT="+lockWait.String()); err != nil {
		return r.abort(setUpErr(strategy, err))
	}
	skus := skuNames("s7", 4)
	// The stock lasts well past the windows compared (sold out at about
	// 0.8 of the load if every order is answered 201).
	r.res.Config.StockPerSKU = stockFor(rate, d, len(skus), 0.8)
	if err := r.startSales(ctx, skus, r.res.Config.StockPerSKU); err != nil {
		return r.abort(err)
	}
	spec := sqlSpec(rate, d)
	// Long enough to see an answer that comes late, not just time it out.
	spec.timeout = orderTimeout + 7*time.Second
	r.startLoad(ctx, skus, spec)

	pause(ctx, d*3/10)
	leader, err := co.leader(ctx)
	if err != nil {
		return r.abort(err)
	}
	tk := r.event("kill -9 the %s leader, %s", co.kind(), co.memberName(leader))
	co.kill(leader)
	newLeader := -1
	elected := waitUntil(ctx, 15*time.Second, func() bool {
		i, err := co.leader(ctx)
		newLeader = i
		return err == nil
	})
	var te time.Duration
	if elected {
		te = r.event("%s leads (seen %.2fs after the kill)", co.memberName(newLeader), seconds(r.load.now()-tk))
	} else {
		te = r.event("no member leads 15s after the kill")
		r.warn("no new %s leader within 15s of the kill", co.kind())
	}
	window := e.scale(3*time.Second, 1500*time.Millisecond)
	pause(ctx, window+500*time.Millisecond)
	tr := r.event("restart %s with its data", co.memberName(leader))
	if err := co.start(leader); err != nil {
		r.warn("the killed member did not rejoin: %v", firstLine(err.Error()))
	} else {
		r.event("%s rejoined (it serves again)", co.memberName(leader))
		if l, err := co.leader(ctx); err == nil {
			r.note("after the restart %s leads; the restarted member serves reads through itself", co.memberName(l))
		}
	}

	r.afterLoad = func(orders []*order) {
		r.res.Figures.RecoverySeconds = recovery(orders, tk, -1)
		// The slowest answer: every wait must end at its deadline.
		bound := orderTimeout + slack
		var slowest time.Duration
		late := 0
		for _, o := range orders {
			for _, a := range o.attempts {
				if a.answer == ansRefused {
					continue
				}
				if dt := a.ret - a.call; dt > slowest {
					slowest = dt
				}
				if a.ret-a.call > bound {
					late++
				}
			}
		}
		s := seconds(slowest)
		r.res.Figures.SlowestSeconds = &s
		if late > 0 {
			msg := fmt.Sprintf("%d requests took longer than ORDER_TIMEOUT + %v (%v); the slowest %.2fs", late, slack, bound, s)
			if e.Short {
				r.warn("%s (short form)", msg)
			} else {
				r.fail("%s", msg)
			}
		}
		// The rate before the kill and after the election.
		from := max(tk-window, d/10)
		rateOf := func(name string, from, to time.Duration) RateCase {
			f := figures(orders, from, to)
			c := RateCase{Name: fmt.Sprintf("%s (%.1f-%.1fs)", name, seconds(from), seconds(to)), Buyers: f.Requests,
				Created: f.Created, Responses503: f.Responses503, Unknown: f.Unknown, SellSeconds: seconds(to - from)}
			if to > from {
				c.OrdersPerSecond = float64(f.Created) / (to - from).Seconds()
			}
			if f.Requests > 0 {
				c.Share503 = float64(f.Responses503) / float64(f.Requests)
			}
			return c
		}
		before := rateOf("before the kill", from, tk)
		during := rateOf("leader down, until elected", tk, te)
		after := rateOf("after the election", te, te+window)
		before.Ratio = 1
		for _, c := range []*RateCase{&during, &after} {
			if before.OrdersPerSecond > 0 {
				c.Ratio = c.OrdersPerSecond / before.OrdersPerSecond
			}
		}
		r.res.Rates = []RateCase{before, during, after}
		for _, c := range r.res.Rates {
			r.note("%s: %.1f orders/s (%.2fx before the kill), 503 to %d of %d requests (%.2f%%), %d of unknown outcome",
				c.Name, c.OrdersPerSecond, c.Ratio, c.Responses503, c.Buyers, 100*c.Share503, c.Unknown)
		}
		desc, back, ok := backToRate(orders, tk, before.OrdersPerSecond, len(r.cluster.Instances))
		r.note("%s", desc)
		if soon := figures(orders, te, te+2*time.Second); elected && soon.Created == 0 {
			r.fail("no order was accepted in the 2s after the new leader was elected (%d requests, %d answered 503): the lock stalled",
				soon.Requests, soon.Responses503)
		} else if limit := te - tk + lockWait + time.Second; !ok || back > limit {
			r.warn("the 201s did not come back to 80%% of the rate before the kill within LOCK_WAIT + 1s of the election (%.2fs after the kill)",
				seconds(limit))
		}
	}
	return r.finish(ctx, phaseMark{"before the kill", 0}, phaseMark{"leader down", tk}, phaseMark{"new leader", te},
		phaseMark{"member restarted", tr})
}

// backToRate describes how long after at the 201s (by the time they were
// answered, in 250 ms bins) came back to 80% of rate, and the requests
// called from at on that took over a second, by instance; back is the end
// of the first bin at that rate, ok false if none was.
func backToRate(orders []*order, at time.Duration, rate float64, instances int) (desc string, back time.Duration, ok bool) {
	const bin = 250 * time.Millisecond
	var bins []int
	slow := make([]int, instances)
	for _, o := range orders {
		for _, a := range o.attempts {
			if a.answer == ansCreated && a.ret >= at {
				i := int((a.ret - at) / bin)
				for len(bins) <= i {
					bins = append(bins, 0)
				}
				bins[i]++
			}
			if a.call >= at && a.answer != ansRefused && a.ret-a.call > time.Second && a.instance < instances {
				slow[a.instance]++
			}
		}
	}
	desc = "the 201s answered never came back to 80% of the rate before the kill"
	for i, n := range bins {
		if float64(n) >= 0.8*rate*bin.Seconds() {
			back, ok = time.Duration(i+1)*bin, true
			desc = fmt.Sprintf("the 201s answered came back to 80%% of the rate before the kill %.2f-%.2fs after it (250 ms bins)",
				seconds(back-bin), seconds(back))
			break
		}
	}
	return fmt.Sprintf("%s; requests called after the kill that took over 1s, by instance: %v", desc, slow), back, ok
}
