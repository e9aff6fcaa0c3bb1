package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/locking/semaphore"
	"github.com/flashsale/stock/lab/testredis"
)

// acquireAfterOutage asks for a place right after the server came back: the
// clients' pooled connections died with it, so a connection error (not a
// refusal) is asked again, a bounded number of times.
func acquireAfterOutage(t *testing.T, s *semaphore.Semaphore, name string) (*semaphore.Permit, error) {
	t.Helper()
	var err error
	for range 5 {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		var p *semaphore.Permit
		p, err = s.Acquire(ctx, name)
		cancel()
		if err == nil || errors.Is(err, semaphore.ErrNotAdmitted) {
			return p, err
		}
	}
	return nil, err
}

// TestDeadFirstHolderKeysExpire pins the package doc's "Every key expires
// a while after its last use, so that names nobody asks for any more leave
// nothing behind", for a name's first holder.
//
// When the holders key does not exist yet (the first, uncontended holder
// of a name: the common case), a PEXPIRE before the admitting ZADD on
// holders would be a no-op and the ZADD would create the key with no TTL:
// if that holder dies (never releases) and nobody asks for the name again,
// the holders key, with its stale entry, would stay forever.
//
// Schedule: lease 100ms (idle = 2*(100ms+1s) = 2.2s); Acquire "sku" once
// and never release; after 3s (well past both the lease and the idle time)
// no key of the name is left.
func TestDeadFirstHolderKeysExpire(t *testing.T) {
	srv := testredis.Start(t)
	rdb := srv.Client(t)
	sems := processes(t, srv, 1, 1, semaphore.WithLease(100*time.Millisecond))
	if _, err := sems[0].Acquire(t.Context(), "sku"); err != nil { // dies holding it
		t.Fatal(err)
	}
	ttl, err := rdb.PTTL(t.Context(), "sem:{sku}:holders").Result()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // expiry under test: 2.2s is the keys' idle time
	left, err := rdb.Keys(t.Context(), "sem:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Fatalf("keys %v still exist 3s after the name's last use (idle time 2.2s); holders' PTTL right after admission was %v", left, ttl)
	}
}

// TestLateReleaseReportsNotHeld pins Release's doc: "It reports false
// when the permit no longer held one (its lease had ended)".
//
// An expired entry is dropped from holders only by the next enter, so
// leave must look at the entry's lease end: a holder whose lease ended,
// releasing before anybody else asked, is told it no longer held its place
// (any Acquire in between would have admitted someone in it).
//
// Schedule: lease 50ms; Acquire; wait 300ms (the lease ends); Release
// returns false.
func TestLateReleaseReportsNotHeld(t *testing.T) {
	srv := testredis.Start(t)
	sems := processes(t, srv, 1, 1, semaphore.WithLease(50*time.Millisecond))
	p, err := sems[0].Acquire(t.Context(), "sku")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // expiry under test: the 50ms lease ends
	held, err := p.Release(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if held {
		t.Fatal("Release 250ms after the permit's lease ended reported that it still held its place")
	}
}

// TestShortLeaseProcessKeepsLongLeaseHolder pins "at most N holders of a
// name at once across processes" when the processes' leases differ
// (WithLease is per process; the service sets it from ORDER_TIMEOUT, so
// two instances configured apart, e.g. during a rolling deploy, differ).
//
// enter must not set a key's TTL to the caller's own idle time 2*(lease+
// wait lease) over a longer one: the holders key, and with it a holder
// whose lease has long to run, would disappear at the short-lease
// process's idle time.
//
// Schedule (limit 1): process A (lease 30s) takes the place; process B
// (lease 100ms, idle 2.2s) asks once as a waiter and gives up; 3s later
// (A's lease has 27s to run) A asks for a second place and is refused.
func TestShortLeaseProcessKeepsLongLeaseHolder(t *testing.T) {
	srv := testredis.Start(t)
	a := processes(t, srv, 1, 1, semaphore.WithLease(30*time.Second))[0]
	b := processes(t, srv, 1, 1, semaphore.WithLease(100*time.Millisecond))[0]
	first, err := a.Acquire(t.Context(), "sku")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	_, err = b.Acquire(ctx, "sku")
	cancel()
	if !errors.Is(err, semaphore.ErrNotAdmitted) {
		t.Fatalf("B was not refused while A held the only place: %v", err)
	}
	time.Sleep(3 * time.Second) // expiry under test: B's idle time (2.2s) passes, A's lease (30s) does not
	ctx, cancel = context.WithTimeout(t.Context(), time.Second)
	second, err := a.Acquire(ctx, "sku")
	cancel()
	if err == nil {
		_, _ = second.Release(t.Context())
		t.Fatal("a second holder admitted (limit 1) while the first holder's 30s lease had 27s to run")
	}
	if !errors.Is(err, semaphore.ErrNotAdmitted) {
		t.Fatal(err)
	}
	_, _ = first.Release(t.Context())
}

// A Redis restarted without its data forgets the holders, and as many
// again would be admitted while the old ones hold: the package says that
// its Redis must keep its data (an append-only file), as the lock packages
// do. With it, a restart keeps the limit.
//
// Schedule (limit 1, lease 10s): process 0 takes the place; the durable
// server stops and restarts; process 1 asks and is not admitted.
func TestRestartWithItsDataKeepsTheLimit(t *testing.T) {
	srv := testredis.StartDurable(t)
	sems := processes(t, srv, 2, 1)
	first, err := sems[0].Acquire(t.Context(), "sku")
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	srv.Restart(t)
	second, err := acquireAfterOutage(t, sems[1], "sku")
	if err == nil {
		_, _ = second.Release(t.Context())
		t.Fatal("a second holder admitted (limit 1) after a Redis restart while the first holder's 10s lease runs")
	}
	if !errors.Is(err, semaphore.ErrNotAdmitted) {
		t.Fatal(err)
	}
	_, _ = first.Release(t.Context())
}

// TestTimedOutWaiterLeavesNoPlace pins "a waiter whose context ends leaves
// nothing behind": Acquire reports ErrNotAdmitted with the context's error
// (the service answers "busy", not "Redis unavailable"), and its enter, in
// flight when the context ended, may admit it afterwards; that place must
// be withdrawn, not count against N until the permit's lease ends (10s
// here, twice ORDER_TIMEOUT in the service). A single leave bounded by
// 500ms is not enough: the server may not answer it in time.
//
// Schedule (limit 1, one client per process): the scripts are loaded (a
// first Acquire/Release of another name); Redis is paused (SIGSTOP);
// process 0's Acquire with a 100ms deadline sends enter, which blocks; the
// deadline ends; a leave cannot reach the paused server within 500ms;
// Acquire returns ErrNotAdmitted; Redis resumes and runs the enter, which
// admits process 0's permit id; process 1 then asks, with 1s to wait, and
// gets the place once it is withdrawn.
func TestTimedOutWaiterLeavesNoPlace(t *testing.T) {
	srv := testredis.Start(t)
	sems := processes(t, srv, 2, 1)
	warm, err := sems[0].Acquire(t.Context(), "warm-up") // loads the scripts: a paused EVALSHA must not come back NOSCRIPT
	if err != nil {
		t.Fatal(err)
	}
	if _, err := warm.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	_, err = sems[0].Acquire(ctx, "sku")
	cancel()
	if rerr := srv.Resume(); rerr != nil {
		t.Fatal(rerr)
	}
	if !errors.Is(err, semaphore.ErrNotAdmitted) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the timed-out Acquire returned %v", err)
	}
	ctx, cancel = context.WithTimeout(t.Context(), time.Second)
	p, err := sems[1].Acquire(ctx, "sku")
	cancel()
	if err != nil {
		n, _ := sems[1].Holders(t.Context(), "sku")
		t.Fatalf("nobody holds a place, yet the next waiter was refused for 1s (%v); holders: %d (the timed-out waiter's)", err, n)
	}
	_, _ = p.Release(t.Context())
}

// TestManyDeadWaitersDoNotJamTheName pins "a dead waiter leaves the queue
// after the wait lease" (and with it every later Acquire of the name) when
// thousands die at once: Redis's Lua (5.1) cannot unpack more than about
// 8000 values (LUAI_MAXCSTACK), so enter must not drop the waiters that
// stopped asking with a single redis.call('ZREM', KEYS[2], unpack(gone)).
// Once that many waiters' wait leases have ended by the time of the next
// enter (many instances' waiters dead at once, or a Redis stall longer
// than the wait lease with that many waiters queued), every such enter
// would fail with "too many results to unpack" before it removed anything:
// the dead waiters would never leave, and every Acquire of the name would
// fail at once with a Redis error, for as long as the keys live.
//
// Schedule (limit 1): process H holds the place (lease 1 minute); 8200
// waiters of a process whose wait lease is 5s (WithPoll(250ms, 250ms))
// each ask once -- the package's own enter script, pipelined, as their
// first Acquire round would -- and die before leaving; 5.5s later every one
// of their wait leases has ended; H releases; process P asks: the place is
// free and P is alone in line, and Acquire admits it.
func TestManyDeadWaitersDoNotJamTheName(t *testing.T) {
	const dead = 8200
	srv := testredis.Start(t)
	rdb := srv.Client(t)
	h := processes(t, srv, 1, 1, semaphore.WithLease(time.Minute))[0]
	p := processes(t, srv, 1, 1)[0]
	held, err := h.Acquire(t.Context(), "sku")
	if err != nil {
		t.Fatal(err)
	}
	keys := h.KeysOf("sku")[:4]
	pipe := rdb.Pipeline()
	for i := range dead {
		// ARGV as Acquire passes them: id, limit, lease ms, wait lease ms.
		semaphore.EnterScript.Eval(t.Context(), pipe, keys, fmt.Sprintf("dead-%d", i), 1, 10_000, 5_000)
	}
	if _, err := pipe.Exec(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n, err := rdb.ZCard(t.Context(), keys[1]).Result(); err != nil || n != dead {
		t.Fatalf("%d waiters queued (%v), want %d", n, err, dead)
	}
	time.Sleep(5500 * time.Millisecond) // expiry under test: the dead waiters' 5s wait lease ends
	if _, err := held.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	got, err := p.Acquire(ctx, "sku")
	cancel()
	if err != nil {
		t.Fatalf("the place is free and the %d dead waiters' wait leases ended 0.5s ago, yet Acquire failed: %v", dead, err)
	}
	_, _ = got.Release(t.Context())
}
