package zklock_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/flashsale/stock/internal/locking/locktest"
	"github.com/flashsale/stock/internal/locking/zklock"
	"github.com/flashsale/stock/lab/testzk"
)

// benchSession is the session timeout of the benchmark's clients: the
// default's, the service's LOCK_TTL.
const benchSession = 5 * time.Second

// lockFunc takes the lock and returns how to release it.
type lockFunc = locktest.LockFunc

type zkImpl struct {
	name string
	// open returns the lock of each of n contenders over srv.
	open func(b *testing.B, srv *testzk.Server, name string, n int) []lockFunc
}

var zkImpls = []zkImpl{
	{"zklock-1proc", func(b *testing.B, srv *testzk.Server, name string, n int) []lockFunc {
		// All contenders are goroutines of one process, sharing a Locker.
		l := newLocker(b, []string{srv.Addr}, zklock.WithSessionTimeout(benchSession))
		return repeat(leaseLock(l, name), n)
	}},
	{"zklock-4procs", func(b *testing.B, srv *testzk.Server, name string, n int) []lockFunc {
		// Four processes (Lockers, sessions), the contenders spread over them.
		locks := make([]lockFunc, n)
		var procs [4]lockFunc
		for p := range procs {
			procs[p] = leaseLock(newLocker(b, []string{srv.Addr}, zklock.WithSessionTimeout(benchSession)), name)
		}
		for i := range locks {
			locks[i] = procs[i%len(procs)]
		}
		return locks
	}},
	{"zk.NewLock", func(b *testing.B, srv *testzk.Server, name string, n int) []lockFunc {
		// The client library's recipe as it is meant to be used: one
		// connection, one zk.Lock per contender.
		conn, _, err := zk.Connect([]string{srv.Addr}, benchSession, zk.WithLogger(zklock.Quiet()), zk.WithLogInfo(false))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(conn.Close)
		locks := make([]lockFunc, n)
		for i := range locks {
			zl := zk.NewLock(conn, "/bench/"+name, zk.WorldACL(zk.PermAll))
			locks[i] = func(context.Context) (func() error, error) {
				// It takes no context: the wait cannot be bounded.
				if err := zl.Lock(); err != nil {
					return nil, err
				}
				return zl.Unlock, nil
			}
		}
		return locks
	}},
}

func repeat(f lockFunc, n int) []lockFunc {
	locks := make([]lockFunc, n)
	for i := range locks {
		locks[i] = f
	}
	return locks
}

func leaseLock(l *zklock.Locker, name string) lockFunc {
	return func(ctx context.Context) (func() error, error) {
		le, err := l.Acquire(ctx, name)
		if err != nil {
			return nil, err
		}
		return func() error { return le.Release(context.Background()) }, nil
	}
}

// received returns how many requests the server has received (srvr's
// "Received", pings included).
func received(b *testing.B, srv *testzk.Server) int64 {
	out, err := testzk.FourLetter(srv.Addr, "srvr")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "Received: "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatalf("no Received in srvr's answer: %q", out)
	return 0
}

// BenchmarkZKContended: 8 and 32 contenders take and release one lock, with
// an empty critical section, through this package (goroutines of one
// process, or of four) and through the client library's zk.NewLock.
// Reported as in redislock's BenchmarkContended: cycles/s, p50 and p99 of
// the acquire wait (ms), fairness (fewest over most cycles of one
// contender) and the requests the server received per cycle.
func BenchmarkZKContended(b *testing.B) {
	srv := testzk.Start(b)
	warmUp(b, srv)
	for _, contenders := range []int{8, 32} {
		for _, impl := range zkImpls {
			b.Run(fmt.Sprintf("contenders=%d/%s", contenders, impl.name), func(b *testing.B) {
				benchContended(b, srv, impl, contenders)
			})
		}
	}
}

func benchContended(b *testing.B, srv *testzk.Server, impl zkImpl, contenders int) {
	name := uniqueName(b)
	locks := impl.open(b, srv, name, contenders)
	// Warm up: the lock's folders exist and every session is up.
	for _, lock := range locks {
		unlock, err := lock(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if err := unlock(); err != nil {
			b.Fatal(err)
		}
	}

	before := received(b, srv)
	locktest.Contend(b, locks, 0)
	b.ReportMetric(float64(received(b, srv)-before)/float64(b.N), "requests/cycle")
}

// warmUp gives the server's JIT compiler some work, so that the first
// implementation measured does not pay for a cold JVM.
func warmUp(b *testing.B, srv *testzk.Server) {
	conn, _, err := zk.Connect([]string{srv.Addr}, benchSession, zk.WithLogger(zklock.Quiet()), zk.WithLogInfo(false))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	acl := zk.WorldACL(zk.PermAll)
	path, err := conn.Create("/warmup", nil, 0, acl)
	if err != nil && err != zk.ErrNodeExists {
		b.Fatal(err)
	}
	for range 5000 {
		p, err := conn.Create(path+"/n-", nil, zk.FlagEphemeral|zk.FlagSequence, acl)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := conn.Multi(&zk.SetDataRequest{Path: p, Version: 0}, &zk.CheckVersionRequest{Path: path, Version: 0}); err != nil {
			b.Fatal(err)
		}
		if _, _, err := conn.Children(path); err != nil {
			b.Fatal(err)
		}
		if err := conn.Delete(p, -1); err != nil {
			b.Fatal(err)
		}
	}
}
