package etcdlock_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/flashsale/stock/internal/locking/etcdlock"
	"github.com/flashsale/stock/internal/locking/locktest"
	"github.com/flashsale/stock/lab/testetcd"
)

// benchTTL is the lease TTL of both recipes: etcdlock's default, and the
// same for concurrency.Session (its own default is 60s).
const benchTTL = 5 * time.Second

// benchProcs is how many "processes" the 4procs/4clients variants spread
// their contenders over: separate etcd clients (and, for etcdlock, separate
// Lockers), contender g on process g%benchProcs.
const benchProcs = 4

// benchLockFunc takes the lock and returns how to release it.
type benchLockFunc = locktest.LockFunc

type benchImpl struct {
	name string
	// open returns one lock per contender over cluster, all for one lock
	// named key, and a func that ends what it opened (sessions, Lockers);
	// that one runs after the timed part. Clients close at b's cleanup.
	open func(b *testing.B, cluster *testetcd.Cluster, key string, contenders int) ([]benchLockFunc, func())
}

var benchImpls = []benchImpl{
	{"etcdlock", func(b *testing.B, cluster *testetcd.Cluster, key string, n int) ([]benchLockFunc, func()) {
		// One process: one client, one Locker shared by every contender,
		// so its local hand-over is part of what is measured.
		return benchEtcdlock(b, cluster, key, n, 1)
	}},
	{"etcdlock-4procs", func(b *testing.B, cluster *testetcd.Cluster, key string, n int) ([]benchLockFunc, func()) {
		// Four processes: four Lockers, each over its own client.
		return benchEtcdlock(b, cluster, key, n, benchProcs)
	}},
	{"concurrency.Mutex", func(b *testing.B, cluster *testetcd.Cluster, key string, n int) ([]benchLockFunc, func()) {
		// etcd's recipe with ONE client shared by every contender (as the
		// one-process etcdlock variant): each contender has its own
		// Session (lease) and Mutex, since a Mutex's key is its session's
		// lease id.
		return benchConcurrencyMutex(b, cluster, key, n, 1)
	}},
	{"concurrency.Mutex-4clients", func(b *testing.B, cluster *testetcd.Cluster, key string, n int) ([]benchLockFunc, func()) {
		// The same over four clients, contender g on client g%4 (as
		// etcdlock-4procs); still one Session and Mutex per contender.
		return benchConcurrencyMutex(b, cluster, key, n, benchProcs)
	}},
}

func benchEtcdlock(b *testing.B, cluster *testetcd.Cluster, key string, n, procs int) ([]benchLockFunc, func()) {
	lockers := make([]*etcdlock.Locker, procs)
	for p := range lockers {
		lockers[p] = etcdlock.New(cluster.Client(b), etcdlock.WithTTL(benchTTL))
	}
	locks := make([]benchLockFunc, n)
	for g := range locks {
		l := lockers[g%procs]
		locks[g] = func(ctx context.Context) (func() error, error) {
			lease, err := l.Acquire(ctx, key)
			if err != nil {
				return nil, err
			}
			return func() error { return lease.Release(context.Background()) }, nil
		}
	}
	return locks, func() {
		for _, l := range lockers {
			_ = l.Close()
		}
	}
}

func benchConcurrencyMutex(b *testing.B, cluster *testetcd.Cluster, key string, n, clients int) ([]benchLockFunc, func()) {
	cs := make([]*clientv3.Client, clients)
	for i := range cs {
		cs[i] = cluster.Client(b)
	}
	sessions := make([]*concurrency.Session, n)
	closeAll := func() {
		for _, s := range sessions {
			if s != nil {
				_ = s.Close()
			}
		}
	}
	locks := make([]benchLockFunc, n)
	for g := range locks {
		s, err := concurrency.NewSession(cs[g%clients], concurrency.WithTTL(int(benchTTL/time.Second)))
		if err != nil {
			closeAll()
			b.Fatal(err)
		}
		sessions[g] = s
		m := concurrency.NewMutex(s, "/bench/cmutex/"+key)
		locks[g] = func(ctx context.Context) (func() error, error) {
			if err := m.Lock(ctx); err != nil {
				return nil, err
			}
			return func() error { return m.Unlock(context.Background()) }, nil
		}
	}
	return locks, closeAll
}

// BenchmarkEtcdContended: 8 and 32 contenders take and release one lock on
// one private etcd member, with an empty critical section; b.N cycles in all,
// split among the contenders first come first served (as BenchmarkContended
// of redislock). Reported with the same names and computations as there:
// cycles/s, p50 and p99 of the acquire wait (ms), fairness (fewest over
// most cycles of one contender).
func BenchmarkEtcdContended(b *testing.B) {
	cluster := testetcd.Start(b)
	var round atomic.Int64
	for _, n := range []int{8, 32} {
		for _, impl := range benchImpls {
			b.Run(fmt.Sprintf("contenders=%d/%s", n, impl.name), func(b *testing.B) {
				key := fmt.Sprintf("bench-%d-%s-%d", n, impl.name, round.Add(1))
				benchEtcdContended(b, cluster, impl, key, n)
			})
		}
	}
}

func benchEtcdContended(b *testing.B, cluster *testetcd.Cluster, impl benchImpl, key string, contenders int) {
	locks, closeAll := impl.open(b, cluster, key, contenders)

	defer closeAll()
	locktest.Contend(b, locks, 0)
}
