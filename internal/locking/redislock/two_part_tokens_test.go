package redislock_test

// The two-part fencing tokens (internal/locking/token.go) and the grants: AdvanceFence
// reaches a chain that begins or hands over while it runs, tokens never
// overflow past an AdvanceFence near the top, a one-server wake message
// carries a counter of any size, and a Redlock successor without confirmed
// subscriptions takes a released lock at once. (That another process's
// AdvanceFence does not reach a running chain is AdvanceFence's documented
// exception: it is pinned in TestHandOverHonoursAdvanceFence.)

import (
	"context"
	"errors"
	"math"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/locking/redislock"
)

// oneKeyScript matches a script call with the single key k and nargs
// arguments: ["evalsha", sha, 1, k, args...].
func oneKeyScript(k string, nargs int) func(args []any) bool {
	return func(args []any) bool {
		if len(args) != 4+nargs {
			return false
		}
		s, ok := args[3].(string)
		return ok && s == k
	}
}

// extendScript matches the single-node extend of lock key k: KEYS k; ARGV
// token, ttl (and the older form, KEYS k, k:fence and a third argument).
func extendScript(k string) func(args []any) bool {
	return func(args []any) bool {
		if len(args) < 4 || args[3] != k {
			return false
		}
		return (len(args) == 6 && args[2] == 1) || (len(args) == 8 && args[2] == 2)
	}
}

// TestAdvanceFenceBeforeLocalStateExistsReachesTheHandOver: one process.
// AdvanceFence records the floor (raiseFenceFloor) before it writes the
// counter in Redis, in the keyState that exists then. Here P has no
// keyState for the key when AdvanceFence starts; its script is held back;
// meanwhile P's first goroutine takes the lock from Redis (old counter c)
// with a second one waiting locally; the script lands and AdvanceFence
// returns nil; the first goroutine releases and hands over a token above
// atLeast, not c<<16+1.
func TestAdvanceFenceBeforeLocalStateExistsReachesTheHandOver(t *testing.T) {
	ctx := context.Background()
	key := uniqueKey(t)
	plain := shared.Client(t)
	hooked := shared.Client(t)
	gate := redislock.NewScriptHold(oneKeyScript("lock:"+key+":fence", 1), false) // advanceFence
	hooked.AddHook(gate)
	p, other := newLocker(t, hooked), newLocker(t, plain)

	holder := acquire(t, other, ctx, key)
	cur, err := plain.Get(ctx, "lock:"+key+":fence").Int64()
	if err != nil {
		t.Fatal(err)
	}
	atLeast := (cur + 100) << 16 // far above anything the next chain starts with

	gate.Arm()
	advanced := make(chan error, 1)
	go func() { advanced <- p.AdvanceFence(ctx, key, atLeast) }()
	gate.Held(t) // raiseFenceFloor has run (no keyState: nothing recorded); K:fence not raised yet

	blocked, hook := blockedSignal()
	p.SetWaitHook(hook)
	leases := make(chan *redislock.Lease, 2)
	for i := range 2 {
		go func() {
			l, err := p.Acquire(ctx, key)
			if err != nil {
				t.Error(err)
				close(leases)
				return
			}
			leases <- l
		}()
		if i == 0 {
			<-blocked
			continue
		}
		for p.LocalWaiters(key) != 1 {
			runtime.Gosched()
		}
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	first := nextLease(t, leases)
	gate.Let()
	if err := <-advanced; err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second := nextLease(t, leases)
	defer second.Release(ctx)
	if second.Token() <= atLeast {
		t.Errorf("hand-over after AdvanceFence(%d) returned nil got token %d (first holder %d)", atLeast, second.Token(), first.Token())
	}
}

// TestAdvanceFenceDuringHandOverConfirmationReachesTheSuccessor: one
// process. handOver computes the successor's token from the floor,
// unlocks, and then confirms the lock in Redis (an extend, as the lock was
// last confirmed more than a renewal interval ago) before it pops the
// successor. An AdvanceFence running entirely within that extend still
// reaches the successor: its lease, handed over after AdvanceFence
// returned nil, has a token above atLeast, not first+1.
func TestAdvanceFenceDuringHandOverConfirmationReachesTheSuccessor(t *testing.T) {
	ctx := context.Background()
	key := uniqueKey(t)
	plain := shared.Client(t)
	hooked := shared.Client(t)
	gate := redislock.NewScriptHold(extendScript("lock:"+key), false)
	hooked.AddHook(gate)
	// A renewal interval of 1ns: every hand-over confirms the lock first.
	// The watchdog itself is paused (renew hook), so only handOver extends.
	p := newLocker(t, hooked, redislock.WithRenewEvery(time.Nanosecond))
	p.SetRenewHook(pause(t))
	other := newLocker(t, plain)

	leases, holder := startBatch(t, p, other, key, 1)
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	first := nextLease(t, leases)
	atLeast := first.Token() + 5

	gate.Arm()
	released := make(chan error, 1)
	go func() { released <- first.Release(ctx) }()
	gate.Held(t) // handOver computed the token and is in its extend
	if err := p.AdvanceFence(ctx, key, atLeast); err != nil {
		t.Fatal(err)
	}
	gate.Let()
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	second := nextLease(t, leases)
	defer second.Release(ctx)
	if second.Token() <= atLeast {
		t.Errorf("hand-over after AdvanceFence(%d) returned nil got token %d (first holder %d)", atLeast, second.Token(), first.Token())
	}
}

// lastCounterToken is (2^47-1)<<16: the first token of the last counter a
// two-part token can carry, a valid token (the old one-part tokens went up
// to MaxInt64). AdvanceFence(lastCounterToken) sets K:fence to 2^47-1, the
// next acquisition takes 2^47, and chainStart(2^47) overflows to MinInt64.
const lastCounterToken = math.MaxInt64 - (1<<16 - 1)

// TestAdvanceFenceNearTheTopNeverOverflows: an AdvanceFence of a token
// near the top is either refused or followed by tokens above it, for a
// Locker's acquisition, a Locker waiter woken by a hand-over and a
// Redlock holder. An overflowing counter would give negative tokens, below
// every earlier holder's (and Locker.Acquire would spin on a lock it holds
// in Redis, as try treats a negative token as "not ours", until its wait
// ends, and leave that lock behind).
func TestAdvanceFenceNearTheTopNeverOverflows(t *testing.T) {
	ctx := context.Background()
	const atLeast = lastCounterToken

	t.Run("locker acquire", func(t *testing.T) {
		l := newLocker(t, shared.Client(t), redislock.WithWait(time.Second))
		key := uniqueKey(t)
		if err := l.AdvanceFence(ctx, key, atLeast); err != nil {
			t.Logf("AdvanceFence refused: %v", err) // refusing is an acceptable answer
			return
		}
		lease, err := l.Acquire(ctx, key)
		if err != nil {
			t.Fatalf("free lock not obtained after AdvanceFence(%d) returned nil: %v", int64(atLeast), err)
		}
		defer lease.Release(ctx)
		if lease.Token() <= atLeast {
			t.Errorf("token %d after AdvanceFence(%d)", lease.Token(), int64(atLeast))
		}
	})

	t.Run("locker hand-over from another process", func(t *testing.T) {
		client := shared.Client(t)
		other := newLocker(t, client)
		p := newLocker(t, client, redislock.WithPollInterval(time.Hour), redislock.WithWait(5*time.Second))
		key := uniqueKey(t)
		holder := acquire(t, other, ctx, key)
		if err := other.AdvanceFence(ctx, key, atLeast); err != nil {
			_ = holder.Release(ctx)
			t.Logf("AdvanceFence refused: %v", err)
			return
		}
		blocked, hook := blockedSignal()
		p.SetWaitHook(hook)
		got := acquireAsync(p, ctx, key)
		<-blocked
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		r := <-got
		if r.err != nil {
			t.Fatalf("waiter not served: %v", r.err)
		}
		defer r.lease.Release(ctx)
		if r.lease.Token() <= atLeast || r.lease.Token() <= holder.Token() {
			t.Errorf("token %d after holder %d and AdvanceFence(%d)", r.lease.Token(), holder.Token(), int64(atLeast))
		}
	})

	t.Run("redlock", func(t *testing.T) {
		_, clients := cluster(t, 3)
		r := newRedlock(t, clients, redislock.WithWait(time.Second))
		key := uniqueKey(t)
		before := acquire(t, r, ctx, key)
		if err := before.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := r.AdvanceFence(ctx, key, atLeast); err != nil {
			t.Logf("AdvanceFence refused: %v", err)
			return
		}
		lease, err := r.Acquire(ctx, key)
		if err != nil {
			t.Fatalf("free lock not obtained after AdvanceFence: %v", err)
		}
		defer lease.Release(ctx)
		if lease.Token() <= atLeast || lease.Token() <= before.Token() {
			t.Errorf("token %d after holder %d and AdvanceFence(%d)", lease.Token(), before.Token(), int64(atLeast))
		}
	})
}

// deafClient is a Redis client whose pub/sub connection never comes up
// (its SUBSCRIBE never gets confirmed): scripts work, wake messages never
// arrive.
type deafClient struct {
	*redis.Client
	ps *redis.Client
}

func (c deafClient) Subscribe(ctx context.Context, channels ...string) *redis.PubSub {
	return c.ps.Subscribe(ctx, channels...)
}

// TestRedlockReleasedGrantWithoutSubscriptionsLooksAtOnce: quorum.acquire
// waits for the predecessor's release announcement only if the grant is
// armed, and core.releaseSlot clears armed when the next waiter's inbox is
// not on confirmed subscriptions (the announcement may not reach it). So a
// local successor whose subscriptions never come up takes the released,
// free lock at once, instead of sleeping for an announcement that cannot
// come for a poll interval (here 1h, so until its wait ends).
func TestRedlockReleasedGrantWithoutSubscriptionsLooksAtOnce(t *testing.T) {
	ctx := context.Background()
	_, clients := cluster(t, 3)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	_ = ln.Close()
	wrapped := make([]redislock.Client, len(clients))
	for i, c := range clients {
		ps := redis.NewClient(&redis.Options{Addr: dead, DialerRetries: 1, MaxRetries: -1})
		t.Cleanup(func() { _ = ps.Close() })
		wrapped[i] = deafClient{Client: c, ps: ps}
	}
	r, err := redislock.NewRedlockClients(wrapped, redislock.WithNodeTimeout(500*time.Millisecond),
		redislock.WithPollInterval(time.Hour), redislock.WithWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	key := uniqueKey(t)

	first := acquire(t, r, ctx, key)
	got := acquireAsync(r, ctx, key)
	for r.LocalWaiters(key) != 1 {
		runtime.Gosched()
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	x := <-got
	if x.err != nil {
		t.Fatalf("local successor did not take the free lock (released by its predecessor) within its wait: %v", x.err)
	}
	if err := x.lease.Release(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Error(err)
	}
}

// TestWakeMessageWithLargeCounterWakesTheWaiter: counters near 2^47. The
// single-node hand-over message carries the INCR result; formatted as a
// Lua number (%.14g), from 10^14 on (2^47 is 1.4*10^14, so the top 29% of
// the counters a token can carry) it would read "tok 1.0000000000000e+14"
// and grantFor could not parse it: the waiter would ignore its own
// hand-over and sleep until its poll (the holder's TTL, or the poll
// interval). The waiter the lock is handed to is served within its wait.
func TestWakeMessageWithLargeCounterWakesTheWaiter(t *testing.T) {
	ctx := context.Background()
	client := shared.Client(t)
	const ttl = 30 * time.Second
	other := newLocker(t, client, redislock.WithTTL(ttl))
	p := newLocker(t, client, redislock.WithTTL(ttl), redislock.WithPollInterval(time.Hour), redislock.WithWait(2*time.Second))
	key := uniqueKey(t)
	holder := acquire(t, other, ctx, key)
	const atLeast = int64(100_000_000_000_000) << 16 // counter 10^14 < 2^47-1: a valid token
	if err := other.AdvanceFence(ctx, key, atLeast); err != nil {
		t.Fatal(err)
	}
	blocked, hook := blockedSignal()
	p.SetWaitHook(hook)
	got := acquireAsync(p, ctx, key)
	<-blocked // queued in Redis behind holder
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter the lock was handed to was not served within its wait: %v", r.err)
	}
	defer r.lease.Release(ctx)
	if r.lease.Token() <= atLeast {
		t.Errorf("token %d after AdvanceFence(%d)", r.lease.Token(), atLeast)
	}
}
