package etcdlock_test

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/flashsale/stock/internal/locking"
	"github.com/flashsale/stock/internal/locking/etcdlock"
	"github.com/flashsale/stock/lab/testetcd"
)

func newLocker(t *testing.T, cli *clientv3.Client, opts ...etcdlock.Option) *etcdlock.Locker {
	t.Helper()
	l := etcdlock.New(cli, append([]etcdlock.Option{etcdlock.WithTTL(testTTL)}, opts...)...)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// queueKeys waits, by reading etcd, until name's queue has n keys, and
// returns them oldest first.
func queueKeys(t *testing.T, cli *clientv3.Client, l *etcdlock.Locker, name string, n int) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := cli.Get(t.Context(), l.QueueDir(name), clientv3.WithPrefix(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == n {
			keys := make([]string, n)
			for i, kv := range resp.Kvs {
				keys[i] = string(kv.Key)
			}
			return keys
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue of %s has %d keys, want %d", name, len(resp.Kvs), n)
		}
	}
}

// takeAndRelease takes name through l on a goroutine of its own, within
// 20 s, releases it, and reports how that went.
func takeAndRelease(t *testing.T, l *etcdlock.Locker, name string) <-chan error {
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		le, err := l.Acquire(ctx, name)
		if err == nil {
			err = le.Release(context.Background())
		}
		got <- err
	}()
	return got
}

// revokeSessionOf ends, from outside, the session whose queue key is key:
// the key's last segment starts with its lease id in hex.
func revokeSessionOf(t *testing.T, cli *clientv3.Client, key string) {
	t.Helper()
	lease := strings.SplitN(key[strings.LastIndex(key, "/")+1:], "-", 2)[0]
	id, err := strconv.ParseInt(lease, 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(t.Context(), clientv3.LeaseID(id)); err != nil {
		t.Fatal(err)
	}
}

// etcd's Unlock cleanup runs without a deadline, so killing a
// three-member cluster's leader stalled its waiters 5–8 s past their
// contexts. Here a waiter comes back at its own deadline, and so does a
// release.
func TestLeaderKilledWaiterGivesUpAtItsDeadline(t *testing.T) {
	cluster := testetcd.StartCluster(t, 3)
	holder := newLocker(t, cluster.Client(t))
	waiter := newLocker(t, cluster.Client(t))
	held, err := holder.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	cluster.Members[cluster.Leader(t)].Kill()

	const wait = 500 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	began := time.Now()
	if _, err := waiter.Acquire(ctx, "k"); !errors.Is(err, locking.ErrNotObtained) {
		t.Fatalf("Acquire of a held lock after the leader's death = %v, want ErrNotObtained", err)
	}
	if took := time.Since(began); took > wait+time.Second {
		t.Fatalf("the waiter came back %v after a %v deadline", took, wait)
	}
	began = time.Now()
	rctx, rcancel := context.WithTimeout(t.Context(), wait)
	defer rcancel()
	_ = held.Release(rctx)
	if took := time.Since(began); took > 2*time.Second {
		t.Fatalf("the release took %v with the leader gone", took)
	}
}

// A waiter of etcd's recipe does not notice that its own session expired
// and waits behind a key that is gone. Here its wait ends with the session
// and it queues again on a new one, so it still gets the lock.
func TestWaiterRequeuesWhenItsSessionEnds(t *testing.T) {
	cluster := testetcd.Start(t)
	cli := cluster.Client(t)
	holder := newLocker(t, cluster.Client(t))
	waiter := newLocker(t, cluster.Client(t))
	held, err := holder.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	got := takeAndRelease(t, waiter, "k")
	keys := queueKeys(t, cli, waiter, "k", 2)
	// End the waiter's session from outside: its key goes with it.
	revokeSessionOf(t, cli, keys[1])
	// It queues again with a new key behind the holder.
	requeued := queueKeys(t, cli, waiter, "k", 2)
	if requeued[1] == keys[1] {
		t.Fatal("the waiter's key survived the revocation of its lease")
	}
	if err := held.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter whose session ended: %v", err)
	}
}

// etcd's recipe names a lock's key after the session's lease, so a stale
// Unlock retried late deletes a newer lock of the same session. Here every
// acquisition has a key of its own and a deletion compares the key's create
// revision.
func TestStaleReleaseKeepsTheSessionsNewerLock(t *testing.T) {
	cluster := testetcd.Start(t)
	cli := cluster.Client(t)
	l := newLocker(t, cluster.Client(t))
	other := newLocker(t, cluster.Client(t))
	first, err := l.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	second, err := l.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if deleted, err := etcdlock.ReplayRelease(t.Context(), first); err != nil || deleted {
		t.Fatalf("the replayed release deleted=%v err=%v, want nothing deleted", deleted, err)
	}
	if keys := queueKeys(t, cli, l, "k", 1); len(keys) != 1 {
		t.Fatal("the newer lock's key is gone")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, err := other.Acquire(ctx, "k"); !errors.Is(err, locking.ErrNotObtained) {
		t.Fatalf("another process took the lock after a stale release: %v", err)
	}
	if err := second.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// A local hand-over after another process queued must still give the next
// holder of this process a token above every earlier one, and the other
// process a token above that: the hand-over writes the key again and takes
// that write's revision (the key's create revision would be below the
// other process's).
func TestLocalHandOverKeepsTokensInHoldOrder(t *testing.T) {
	cluster := testetcd.Start(t)
	cli := cluster.Client(t)
	p := newLocker(t, cluster.Client(t))
	q := newLocker(t, cluster.Client(t))
	var (
		mu     sync.Mutex
		order  []string
		tokens []int64
	)
	record := func(who string, le *etcdlock.Lease) {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, who)
		tokens = append(tokens, le.Token())
	}
	errs := make(chan error, 3)
	holdUntil := func(l *etcdlock.Locker, who string, release <-chan struct{}) {
		le, err := l.Acquire(t.Context(), "k")
		if err != nil {
			errs <- err
			return
		}
		record(who, le)
		<-release
		errs <- le.Release(context.Background())
	}
	now := make(chan struct{})
	close(now)

	q1, err := q.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	record("q1", q1)
	releaseP1 := make(chan struct{})
	go holdUntil(p, "p1", releaseP1)
	pKey := queueKeys(t, cli, p, "k", 2)[1] // p1 queued in etcd behind q1
	go holdUntil(p, "p2", now)
	for p.LocalWaiting("k") < 1 {
		runtime.Gosched()
	}
	if err := q1.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	// p1 holds (with p2 waiting in its process); q2 queues behind it.
	go holdUntil(q, "q2", now)
	if keys := queueKeys(t, cli, q, "k", 2); keys[0] != pKey {
		t.Fatalf("queue %v, want p's key first", keys)
	}
	close(releaseP1)
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := strings.Join(order, " "); got != "q1 p1 p2 q2" {
		t.Fatalf("hold order %s, want q1 p1 p2 q2 (p1 hands over to p2 inside its process)", got)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("tokens %v in hold order %v: they must grow", tokens, order)
		}
	}
}

// A waiter can find its own key gone (its lease revoked, or expired while
// renewals were held up) before its renewal loop notices. Its next queue
// write then fails for the lease; it must take that as the end of its
// session and queue again on a new one, not fail the order.
func TestWaiterRequeuesWhenItFindsItsLeaseGoneFirst(t *testing.T) {
	cluster := testetcd.Start(t)
	cli := cluster.Client(t)
	holder := newLocker(t, cluster.Client(t))
	// A long TTL: the renewal loop looks at the lease only every 3 s.
	waiter := etcdlock.New(cluster.Client(t), etcdlock.WithTTL(9*time.Second))
	t.Cleanup(func() { _ = waiter.Close() })
	held, err := holder.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	got := takeAndRelease(t, waiter, "k")
	keys := queueKeys(t, cli, waiter, "k", 2)
	revokeSessionOf(t, cli, keys[1])
	// The holder leaves at once: the waiter reads the queue again long
	// before its renewal loop would notice the revocation.
	if err := held.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter that found its lease gone: %v", err)
	}
}

// A batch's local hand-overs take the next places of its token without a
// request to etcd (its revision does not move), and the first holder of
// the next batch, in another process, gets a token above them all. After
// this process's own AdvanceFence, a place at or below the fence is not
// handed on: the holder begins a new batch, above it.
func TestBatchHandsOnPlacesWithoutWrites(t *testing.T) {
	cluster := testetcd.Start(t)
	cli := cluster.Client(t)
	p := newLocker(t, cluster.Client(t))
	q := newLocker(t, cluster.Client(t))
	revision := func() int64 {
		t.Helper()
		resp, err := cli.Get(t.Context(), "any")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	type res struct {
		le  *etcdlock.Lease
		err error
	}
	acquire := func(l *etcdlock.Locker) <-chan res {
		ch := make(chan res, 1)
		go func() {
			le, err := l.Acquire(t.Context(), "k")
			ch <- res{le, err}
		}()
		return ch
	}
	got := func(ch <-chan res) *etcdlock.Lease {
		t.Helper()
		r := <-ch
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.le
	}

	blocker, err := q.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	first := acquire(p)
	queueKeys(t, cli, p, "k", 2) // p's key queued behind q's
	var rest []<-chan res
	for i := range 4 {
		rest = append(rest, acquire(p))
		for p.LocalWaiting("k") < i+1 {
			runtime.Gosched()
		}
	}
	if err := blocker.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	le := got(first)
	tokens := []int64{le.Token()}
	before := revision()
	for _, r := range rest[:3] {
		if err := le.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		le = got(r)
		tokens = append(tokens, le.Token())
	}
	if after := revision(); after != before {
		t.Fatalf("etcd's revision went from %d to %d over %d local hand-overs: want no writes", before, after, len(tokens)-1)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] != tokens[i-1]+1 {
			t.Fatalf("tokens %v: hand-over %d did not take the next place", tokens, i)
		}
	}
	// This process advances the fence: the last local waiter begins a new
	// batch above it.
	fence := le.Token() + 1
	if err := p.AdvanceFence(t.Context(), "k", fence); err != nil {
		t.Fatal(err)
	}
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	le = got(rest[3])
	if le.Token() <= fence {
		t.Fatalf("token %d handed on after AdvanceFence(%d)", le.Token(), fence)
	}
	last := le.Token()
	next := acquire(q)
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	le = got(next)
	if le.Token() <= last {
		t.Fatalf("token %d of the next batch after %d", le.Token(), last)
	}
	if err := le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}
