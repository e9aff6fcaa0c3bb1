package redislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/locking/redislock"
)

// newLateLeaveClient holds back the next release script of the
// single-server lock (singleLeave: 3 keys, 7 arguments) once armed: the
// caller sees a timeout at once, as when the node timeout ran out, and the
// script reaches the server only when the test delivers it, as a call the
// client gave up on that lands late.
func newLateLeaveClient(c *redis.Client) *holdBackClient {
	return &holdBackClient{Client: c, nkeys: 3, nargs: 7}
}

// TestLateLeaveQueuesSuccessorTwice: Locker. A's release (with B, the next
// local waiter, as successor) times out at the client, so B gets the slot
// with nothing granted and polls: it is queued on the server (entry E1).
// Then A's release lands: it frees A's lock, promotes E1 (the lock is B's,
// the hand-over published) and, because the lock was not free for B any
// more, also RPUSHes a second entry E2 for B. B takes the lock and releases
// it; its release removes E1 only, and promote hands the free lock to E2:
// B's released value holds the key again for a TTL, though its tombstone
// exists and nobody will ever delete it. Nobody else can take the key.
func TestLateLeaveQueuesSuccessorTwice(t *testing.T) {
	ctx := context.Background()
	base := shared.Client(t)
	lc := newLateLeaveClient(base)
	const ttl = 30 * time.Second
	l := redislock.New(lc, redislock.WithTTL(ttl), redislock.WithPollInterval(time.Hour), redislock.WithWait(time.Minute))
	t.Cleanup(func() { _ = l.Close() })
	other := newLocker(t, base, redislock.WithTTL(ttl))
	key := uniqueKey(t)

	waiting, hook := blockedSignal()
	l.SetWaitHook(hook)
	a := acquire(t, l, ctx, key)
	got := acquireAsync(l, ctx, key)
	awaitLocalWaiter(t, l, key, got)
	lc.mu.Lock()
	lc.armed = true
	lc.mu.Unlock()
	if err := a.Release(ctx); err == nil {
		t.Fatal("A's release should have reported the (injected) timeout")
	}
	<-waiting // B polled: it is queued on the server, behind A's lock
	lc.mu.Lock()
	deliver := lc.stashed
	lc.mu.Unlock()
	if deliver == nil {
		t.Fatal("no release was held back")
	}
	// A late call is late: by the node timeout, in the service. Without
	// the gap, the second entry can equal the first to the millisecond
	// (both end at B's deadline) and B's release removes it by chance.
	time.Sleep(20 * time.Millisecond)
	if err := deliver(); err != nil { // A's release lands now
		t.Fatal(err)
	}
	q1, _ := base.LRange(ctx, "lock:"+key+":queue", 0, -1).Result()
	k1, _ := base.Get(ctx, "lock:"+key).Result()
	t.Logf("after A's late release: key %q queue %q", k1, q1)
	r := <-got
	if r.err != nil {
		t.Fatalf("B: %v", r.err)
	}
	b := r.lease
	bValue := b.Value()
	t.Logf("B value %q", bValue)
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if v, err := base.Get(ctx, "lock:"+key).Result(); !errors.Is(err, redis.Nil) {
		pttl, _ := base.PTTL(ctx, "lock:"+key).Result()
		t.Errorf("after B's release the key holds %q (B's value: %v; pttl %v, err %v), want it free", v, v == bValue, pttl, err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	next, err := other.Acquire(wctx, key)
	if err != nil {
		t.Fatalf("the key is blocked after B released it: %v", err)
	}
	_ = next.Release(ctx)
}

// TestLateLeaveHandsLockToRetiredSuccessor: Locker. As above, A's release
// with B as successor lands late; meanwhile B polled (queued), then gave
// up: B's leave removed its entry and left B's tombstone. A's release then
// lands and, the queue being empty, SETs the key to B's value: singleLeave
// hands the lock to its successor without looking at the successor's
// tombstone (nor does promote look at the tombstones of queued entries).
// Nobody holds or will release B's value: the key is blocked for a TTL.
func TestLateLeaveHandsLockToRetiredSuccessor(t *testing.T) {
	ctx := context.Background()
	base := shared.Client(t)
	lc := newLateLeaveClient(base)
	const ttl = 30 * time.Second
	l := redislock.New(lc, redislock.WithTTL(ttl), redislock.WithPollInterval(time.Hour), redislock.WithWait(time.Minute))
	t.Cleanup(func() { _ = l.Close() })
	other := newLocker(t, base, redislock.WithTTL(ttl))
	key := uniqueKey(t)

	waiting, hook := blockedSignal()
	l.SetWaitHook(hook)
	a := acquire(t, l, ctx, key)
	bctx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	got := acquireAsync(l, bctx, key)
	awaitLocalWaiter(t, l, key, got)
	lc.mu.Lock()
	lc.armed = true
	lc.mu.Unlock()
	if err := a.Release(ctx); err == nil {
		t.Fatal("A's release should have reported the (injected) timeout")
	}
	<-waiting // B polled: it is queued on the server, behind A's lock
	giveUp()
	if r := <-got; r.err == nil {
		_ = r.lease.Release(ctx)
		t.Fatal("B got the lock; the test wants it to give up")
	}
	lc.mu.Lock()
	deliver := lc.stashed
	lc.mu.Unlock()
	if err := deliver(); err != nil { // A's release lands now
		t.Fatal(err)
	}
	if v, err := base.Get(ctx, "lock:"+key).Result(); !errors.Is(err, redis.Nil) {
		gone, _ := base.Exists(ctx, "lock:"+key+":gone:"+v).Result()
		t.Errorf("after A's late release the key holds %q (its tombstone exists: %v; err %v), want it free", v, gone == 1, err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	next, err := other.Acquire(wctx, key)
	if err != nil {
		t.Fatalf("the key is blocked by a value nobody holds: %v", err)
	}
	_ = next.Release(ctx)
}
