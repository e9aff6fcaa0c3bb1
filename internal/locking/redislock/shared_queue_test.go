package redislock

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/stock/lab/testredis"
)

// keptState reports what the core keeps for key: the keyState, its users,
// its subscriptions' refs, and how many wait in the local queue.
func (c *core) keptState(key string) string {
	c.mu.Lock()
	ks := c.keys[key]
	var users, subs int
	if ks != nil {
		users, subs = ks.users, len(ks.subs)
	}
	c.mu.Unlock()
	refs := 0
	for _, n := range c.notifiers {
		n.mu.Lock()
		if s := n.subs[c.be.channel(key)]; s != nil {
			refs += s.refs
		}
		n.mu.Unlock()
	}
	return fmt.Sprintf("keyState=%v users=%d subs=%d refs=%d waiting=%d", ks != nil, users, subs, refs, c.queue.Waiting(key))
}

// The shared local queue (handoff.Queue in core.go) under randomized
// contention over two Lockers (or Redlocks) with waits that end at random,
// AdvanceFence from one of them and, for Lockers, Close halfway: no
// overlap, tokens strictly increasing, a lease of the Locker that advanced
// the fence above every floor that returned before its Acquire began, and
// nothing left for the key (keyState, subscription refs, queue line) once
// every goroutine is done.
type stressLock interface {
	Acquire(ctx context.Context, key string) (*Lease, error)
	AdvanceFence(ctx context.Context, key string, atLeast int64) error
	Close() error
}

func stressQueue(t *testing.T, ls []stressLock, cores []*core, closeAt time.Duration) {
	ctx := context.Background()
	key := fmt.Sprintf("stress-%d", rand.Int64())
	var inside atomic.Int32
	var bad, tokBad, floorBad atomic.Int32
	var last atomic.Int64
	var floor atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(2 * time.Second)
	if closeAt > 0 {
		time.AfterFunc(closeAt, func() { _ = ls[0].Close() })
	}
	for g := range 24 {
		wg.Go(func() {
			l := ls[g%len(ls)]
			for time.Now().Before(end) {
				if g == 0 {
					f := last.Load() + int64(rand.IntN(1<<17))
					if l.AdvanceFence(ctx, key, f) == nil {
						for m := floor.Load(); f > m && !floor.CompareAndSwap(m, f); m = floor.Load() {
						}
					}
					continue
				}
				before := floor.Load()
				d := time.Duration(rand.IntN(5000)) * time.Microsecond
				actx, cancel := context.WithTimeout(ctx, d)
				lease, err := l.Acquire(actx, key)
				cancel()
				if err != nil {
					continue
				}
				if inside.Add(1) != 1 {
					bad.Add(1)
				}
				if g%len(ls) == 0 && lease.Token() <= before {
					floorBad.Add(1)
				}
				if prev := last.Swap(lease.Token()); lease.Token() <= prev && lease.Context().Err() == nil {
					tokBad.Add(1)
				}
				inside.Add(-1)
				_ = lease.Release(ctx)
			}
		})
	}
	wg.Wait()
	if bad.Load()+tokBad.Load()+floorBad.Load() > 0 {
		t.Errorf("%d overlaps, %d tokens not increasing, %d below floor", bad.Load(), tokBad.Load(), floorBad.Load())
	}
	for i, c := range cores {
		if s := c.keptState(c.cfg.prefix + key); s != "keyState=false users=0 subs=0 refs=0 waiting=0" {
			t.Errorf("locker %d: %s", i, s)
		}
	}
}

// TestRedlockStressKeepsExclusionAndLeavesNothing has no Close variant: a
// Release that runs while Close drains calls q.bg.Add concurrently with
// q.bg.Wait (quorum.release, core.close), a race that the race detector
// reports.
func TestRedlockStressKeepsExclusionAndLeavesNothing(t *testing.T) {
	for _, closeAt := range []time.Duration{0} {
		t.Run(fmt.Sprint(closeAt), func(t *testing.T) {
			var clients []Client
			for range 3 {
				clients = append(clients, testredis.Start(t).Client(t))
			}
			var ls []stressLock
			var cores []*core
			for range 2 {
				r, err := newRedlock(clients, WithNodeTimeout(500*time.Millisecond))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = r.Close() })
				ls, cores = append(ls, r), append(cores, r.c)
			}
			stressQueue(t, ls, cores, closeAt)
		})
	}
}

func TestLockerStressKeepsExclusionAndLeavesNothing(t *testing.T) {
	for _, closeAt := range []time.Duration{0, time.Second} {
		t.Run(fmt.Sprint(closeAt), func(t *testing.T) {
			srv := testredis.Start(t)
			var ls []stressLock
			var cores []*core
			for range 2 {
				l := New(srv.Client(t))
				t.Cleanup(func() { _ = l.Close() })
				ls, cores = append(ls, l), append(cores, l.c)
			}
			stressQueue(t, ls, cores, closeAt)
		})
	}
}

// TestResetBetweenAcquireAndGenerationEndsTheChain: a Reset that lands
// between the acquire script and the read of the chain's generation ends
// the chain. Otherwise the holder's lease begins after Reset returned, and
// its release hands the deleted lock on without Redis; another process
// then takes the lock while the successor holds it: two holders.
func TestResetBetweenAcquireAndGenerationEndsTheChain(t *testing.T) {
	ctx := context.Background()
	srv := testredis.Start(t)
	key := fmt.Sprintf("reset-%d", rand.Int64())
	hooked := srv.Client(t)
	h := NewScriptHold(FirstKeyIs("lock:"+key), true)
	hooked.AddHook(h)
	p, other := New(hooked), New(srv.Client(t))
	t.Cleanup(func() { _ = p.Close(); _ = other.Close() })

	h.Arm()
	first := make(chan *Lease, 1)
	go func() {
		l, err := p.Acquire(ctx, key)
		if err != nil {
			t.Error(err)
		}
		first <- l
	}()
	h.Held(t) // the acquire script took the lock; its reply is held
	second := make(chan *Lease, 1)
	go func() {
		l, err := p.Acquire(ctx, key)
		if err != nil {
			t.Error(err)
		}
		second <- l
	}()
	for p.LocalWaiters(key) != 1 {
		runtime.Gosched()
	}
	if err := p.Reset(ctx, key); err != nil {
		t.Fatal(err)
	}
	h.Let()
	l1 := <-first
	if l1 == nil {
		t.FailNow()
	}
	t.Logf("l1 token %d release: %v", l1.Token(), l1.Release(ctx))
	l2 := <-second
	if l2 == nil {
		t.FailNow()
	}
	defer l2.Release(ctx)
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	o, err := other.Acquire(wctx, key)
	t.Logf("l2 token %d ctx %v; other: %v", l2.Token(), context.Cause(l2.Context()), err)
	if err == nil {
		defer o.Release(ctx)
		if l2.Context().Err() == nil {
			t.Fatalf("two holders after Reset: the handed-on goroutine (token %d) and another process (token %d)", l2.Token(), o.Token())
		}
	}
}

// TestClaimedWaiterThatGivesUpPassesTheLockOn: the holder's release has
// claimed waiter W and named it to Redis (the script gave W the lock); W's
// wait ends before Give; W passes the lock on to N (in Redis too, so no
// other process gets it while N holds it), leaves exactly once, and the
// key leaves nothing behind.
func TestClaimedWaiterThatGivesUpPassesTheLockOn(t *testing.T) {
	ctx := context.Background()
	srv := testredis.Start(t)
	key := fmt.Sprintf("claimed-%d", rand.Int64())
	hooked := srv.Client(t)
	h := NewScriptHold(FirstKeyIs("lock:"+key), true)
	hooked.AddHook(h)
	p, other := New(hooked), New(srv.Client(t))
	t.Cleanup(func() { _ = p.Close(); _ = other.Close() })

	holder, err := p.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancelW := context.WithCancel(ctx)
	wErr := make(chan error, 1)
	go func() {
		l, err := p.Acquire(wctx, key)
		if l != nil {
			_ = l.Release(ctx)
		}
		wErr <- err
	}()
	for p.LocalWaiters(key) != 1 {
		runtime.Gosched()
	}
	nLease := make(chan *Lease, 1)
	go func() {
		l, err := p.Acquire(ctx, key)
		if err != nil {
			t.Error(err)
		}
		nLease <- l
	}()
	for p.LocalWaiters(key) != 2 {
		runtime.Gosched()
	}
	h.Arm()
	released := make(chan error, 1)
	go func() { released <- holder.Release(ctx) }()
	h.Held(t) // the leave script ran: W holds the lock in Redis
	if n := p.LocalWaiters(key); n != 1 {
		t.Errorf("%d local waiters after the claim, want 1 (N)", n)
	}
	cancelW()
	h.Let()
	if err := <-released; err != nil {
		t.Error(err)
	}
	if err := <-wErr; err == nil {
		t.Error("W obtained the lock after its wait ended")
	}
	n := <-nLease
	if n == nil {
		t.FailNow()
	}
	octx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if o, err := other.Acquire(octx, key); err == nil {
		_ = o.Release(ctx)
		t.Fatalf("another process took the lock while N holds it (token %d, other %d)", n.Token(), o.Token())
	}
	if err := n.Release(ctx); err != nil {
		t.Errorf("N's release: %v", err)
	}
	if s := p.c.keptState("lock:" + key); s != "keyState=false users=0 subs=0 refs=0 waiting=0" {
		t.Errorf("left behind: %s", s)
	}
}
