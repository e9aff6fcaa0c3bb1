package etcdlock_test

// A lease's Context ends before the lock can be granted to someone else,
// no wait outlasts its context, and the queue never keeps a waiter behind
// a key nobody will delete. Each test drives a schedule that would break
// one of these and checks that it holds; a test's comment describes the
// schedule and what would go wrong.

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/flashsale/stock/internal/locking"
	"github.com/flashsale/stock/internal/locking/etcdlock"
	"github.com/flashsale/stock/lab/testetcd"
)

type acquireResult struct {
	le  *etcdlock.Lease
	err error
}

func acquireAsync(l *etcdlock.Locker, ctx context.Context, name string) <-chan acquireResult {
	got := make(chan acquireResult, 1)
	go func() {
		le, err := l.Acquire(ctx, name)
		got <- acquireResult{le, err}
	}()
	return got
}

// A waiter never hangs past its context. session() grants one lease at a
// time, held across Grant(wctx) of whichever waiter came first. While etcd
// does not answer, every other name's first waiter waits for that grant,
// and must come back at its own context's end, not when the first waiter's
// Grant gives up at ITS deadline.
//
// Schedule: etcd unreachable (link frozen). G1: Acquire(ctx 4s, "a") ->
// session() -> takes the grant -> Grant blocks. G2: Acquire(ctx 100ms,
// "b") -> local turn of "b" -> session() -> waits for the grant. G2's
// deadline passes; G2 comes back then, not when G1's Grant fails at 4s.
func TestWaitForALeaseGrantEndsWithTheContext(t *testing.T) {
	cluster := testetcd.Start(t)
	cli, link := proxiedClient(t, cluster)
	if _, err := cli.Get(t.Context(), "warm-up"); err != nil { // connect before the freeze
		t.Fatal(err)
	}
	l := newLocker(t, cli)
	link.Freeze()
	t.Cleanup(link.Thaw) // runs before the Locker's Close

	const first = 4 * time.Second
	fctx, fcancel := context.WithTimeout(context.Background(), first)
	defer fcancel()
	firstDone := acquireAsync(l, fctx, "a")
	deadline := time.Now().Add(10 * time.Second)
	for !etcdlock.GrantBusy(l) {
		if time.Now().After(deadline) {
			t.Fatal("the first waiter never entered Grant")
		}
		runtime.Gosched()
	}

	const wait = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	began := time.Now()
	_, err := l.Acquire(ctx, "b")
	took := time.Since(began)
	if !errors.Is(err, locking.ErrNotObtained) {
		t.Errorf("Acquire(b) = %v, want ErrNotObtained", err)
	}
	if took > wait+time.Second {
		t.Errorf("Acquire of another name with a %v context came back after %v: it waited on the grant mutex held by a waiter whose own Grant had %v", wait, took.Round(time.Millisecond), first)
	}
	link.Thaw()
	<-firstDone
}

// A lease's Context ends before the lock can be granted to someone else,
// also while the renewal observer blocks: the session still ends at its
// validity, rather than the lease expiring in etcd, another process taking
// the lock, and the first holder's Context staying live.
//
// Schedule: P acquires k (lease L, TTL 1s). P's keepAlive renews at
// +333ms, calls onRenew(nil), which blocks (a slow metrics sink, a full
// channel, a logger on a slow disk). No renewal goes out; L expires in
// etcd at ~+1.33s and its key is deleted; Q's waiter reads the queue after
// the deletion and holds with a greater token. By then P's lease Context
// has ended: never two leases with live contexts.
func TestSlowRenewalObserverCannotKeepALeaseAlive(t *testing.T) {
	cluster := testetcd.Start(t)
	blocked := make(chan struct{})
	unblock := make(chan struct{})
	var blockOnce, unblockOnce sync.Once
	p := newLocker(t, cluster.Client(t), etcdlock.WithRenewalObserver(func(err error) {
		if err != nil {
			return
		}
		first := false
		blockOnce.Do(func() { first = true })
		if first {
			close(blocked)
			<-unblock
		}
	}))
	t.Cleanup(func() { unblockOnce.Do(func() { close(unblock) }) }) // before p.Close
	q := newLocker(t, cluster.Client(t))

	held, err := p.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-blocked:
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	other, err := q.Acquire(ctx, "k")
	if err != nil {
		t.Fatalf("q: %v", err)
	}
	if held.Context().Err() == nil {
		t.Errorf("q holds k (token %d) while p's lease (token %d) still has a live Context: the session's validity ran out in etcd but nothing ended it while the renewal observer ran", other.Token(), held.Token())
	}
	unblockOnce.Do(func() { close(unblock) })
	_ = other.Release(context.Background())
	_ = held.Release(context.Background())
}

// WithRenewalObserver documents that the session is given up before the
// observer hears of a failed renewal, and that the leases' contexts end at
// once.
func TestLeasesEndWhenTheObserverHearsOfAFailedRenewal(t *testing.T) {
	cluster := testetcd.Start(t)
	cli, link := proxiedClient(t, cluster)
	var held atomic.Pointer[etcdlock.Lease]
	seen := make(chan struct{}, 1)
	p := newLocker(t, cli, etcdlock.WithRenewalObserver(func(err error) {
		if err == nil || held.Load() == nil {
			return
		}
		select {
		case seen <- struct{}{}:
		default:
		}
	}))
	le, err := p.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	held.Store(le)
	link.Freeze()
	t.Cleanup(link.Thaw)
	select {
	case <-seen:
	case <-time.After(10 * time.Second):
		t.Fatal("no failed renewal")
	}
	select {
	case <-le.Context().Done():
	case <-time.After(time.Second):
		t.Error("the lease's Context was still live a second after the observer heard of the failed renewal")
	}
	link.Thaw()
	_ = le.Release(context.Background())
}

// Reset deletes the holder's key and the next process takes the lock; the
// old holder's Context has ended by then, so it can neither go on as a
// holder nor re-enter its hold with its old token (beyond Reset's promise
// that the old holder's Release reports ErrLockLost).
func TestResetEndsTheOldHoldersLease(t *testing.T) {
	cluster := testetcd.Start(t)
	p := newLocker(t, cluster.Client(t))
	q := newLocker(t, cluster.Client(t))
	held, err := p.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Reset(t.Context(), "k"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	other, err := q.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	again, rerr := p.Acquire(held.Context(), "k")
	if held.Context().Err() == nil {
		reentered := "no"
		if rerr == nil {
			reentered = fmt.Sprintf("yes, token %d", again.Token())
		}
		t.Errorf("after Reset q holds k (token %d) while p's lease (token %d) has a live Context (p re-enters its hold: %s)", other.Token(), held.Token(), reentered)
	}
	if rerr == nil {
		_ = again.Release(context.Background())
	}
	_ = other.Release(context.Background())
	_ = held.Release(context.Background())
}

// queueDir(name) is prefix+"q/"+name+"/", so the queue of "sale/eu" would
// lie inside the prefix of "sale": Reset("sale") would delete "sale/eu"'s
// holder's key, and a waiter for "sale" would take a "sale/eu" key as its
// predecessor. Names with '/' are refused; names that share a beginning
// do not nest.
func TestNamesDoNotNest(t *testing.T) {
	cluster := testetcd.Start(t)
	p := newLocker(t, cluster.Client(t))
	q := newLocker(t, cluster.Client(t))
	if le, err := p.Acquire(t.Context(), "sale/eu"); err == nil {
		_ = le.Release(context.Background())
		t.Fatal("a name with '/' was accepted: its queue would lie inside another name's")
	}
	held, err := p.Acquire(t.Context(), "sale-eu")
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer wcancel()
	if le, err := q.Acquire(wctx, "sale"); err != nil {
		t.Errorf("Acquire(\"sale\"), which nobody holds, failed while \"sale-eu\" is held: %v", err)
	} else {
		_ = le.Release(context.Background())
	}
	if err := q.Reset(t.Context(), "sale"); err != nil {
		t.Fatal(err)
	}
	if held.Context().Err() != nil {
		t.Errorf("Reset(\"sale\") ended the lease on \"sale-eu\": %v", context.Cause(held.Context()))
	}
	_ = held.Release(context.Background())
}

// AdvanceFence promises "every later token of name greater than atLeast",
// also for a waiter whose predecessor was deleted at revision d: it takes
// base+d from a READ at d, so AdvanceFence(base+d), read at the same
// revision d, must not return without writing.
//
// Schedule: P holds k; Q waits, its watch in place (then its link is
// frozen, so its next read comes later).
// P releases: delete at rev d. AdvanceFence(k, d) returns. Q's link thaws:
// Q reads and holds with a token above d (without a write by AdvanceFence
// it would read at rev d and hold with token d == atLeast).
func TestAdvanceFenceLeavesLaterTokensAbove(t *testing.T) {
	cluster := testetcd.Start(t)
	cli := cluster.Client(t)
	p := newLocker(t, cluster.Client(t))
	qcli, qlink := proxiedClient(t, cluster)
	q := newLocker(t, qcli, etcdlock.WithTTL(5*time.Second))
	held, err := p.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	parked := make(chan struct{}, 1)
	q.OnParked(func(string) {
		select {
		case parked <- struct{}{}:
		default:
		}
	})
	got := acquireAsync(q, ctx, "k")
	select {
	case <-parked: // Q's read of the queue is done; the next one follows the deletion
	case <-ctx.Done():
		t.Fatal("Q never waited behind P")
	}
	qlink.Freeze()
	t.Cleanup(qlink.Thaw)
	if err := held.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(t.Context(), "any")
	if err != nil {
		t.Fatal(err)
	}
	atLeast := resp.Header.Revision // the release's revision; fence base 0
	if err := p.AdvanceFence(t.Context(), "k", atLeast); err != nil {
		t.Fatal(err)
	}
	qlink.Thaw()
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.le.Release(context.Background())
	if r.le.Token() <= atLeast {
		t.Errorf("AdvanceFence(k, %d) returned, then Q took k with token %d: not greater than atLeast", atLeast, r.le.Token())
	}
}

// A waiter never leaves a key behind that would block others until a
// lease expires, and a waiter whose session ends re-queues. When the
// session is lost locally while its lease still lives in etcd (a renewal
// error that etcd's client does not retry; a leader change, which extends
// every lease), the waiter re-queues on a new session, and the key of the
// old session must be deleted: its new key queues BEHIND the dead one, so
// if the dead key stayed, once the holder releases, the waiter (and
// everyone behind it) would wait for the dead lease to expire.
func TestRequeuedWaiterIsNotBehindItsOwnDeadKey(t *testing.T) {
	cluster := testetcd.Start(t)
	cli := cluster.Client(t)
	holder := newLocker(t, cluster.Client(t))
	waiter := newLocker(t, cluster.Client(t), etcdlock.WithTTL(5*time.Second))
	for round := range 8 {
		name := fmt.Sprintf("k%d", round)
		held, err := holder.Acquire(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		got := acquireAsync(waiter, t.Context(), name)
		keys := queueKeys(t, cli, waiter, name, 2)
		dead := keys[1]
		lease, ok := etcdlock.FailRenewal(waiter, errors.New("injected: etcdserver: too many requests"))
		if !ok {
			t.Fatal("no session")
		}
		// The waiter re-queues with a key of its new session.
		deadline := time.Now().Add(10 * time.Second)
		for {
			resp, err := cli.Get(t.Context(), waiter.QueueDir(name), clientv3.WithPrefix(), clientv3.WithKeysOnly())
			if err != nil {
				t.Fatal(err)
			}
			requeued := false
			for _, kv := range resp.Kvs {
				if k := string(kv.Key); k != keys[0] && k != dead {
					requeued = true
				}
			}
			if requeued {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the waiter did not re-queue")
			}
		}
		if err := held.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-got:
			if r.err != nil {
				t.Fatal(r.err)
			}
			_ = r.le.Release(context.Background())
			continue // deleteKey happened to delete the dead key this round
		case <-time.After(1500 * time.Millisecond):
		}
		ttl, _ := cli.TimeToLive(t.Context(), clientv3.LeaseID(lease))
		resp, _ := cli.Get(t.Context(), waiter.QueueDir(name), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		var left []string
		for _, kv := range resp.Kvs {
			left = append(left, string(kv.Key))
		}
		var remaining int64 = -1
		if ttl != nil {
			remaining = ttl.TTL
		}
		t.Errorf("round %d: the holder released %s 1.5s ago and the lock is free, but the waiter still waits behind the key of its own lost session %s (lease %x, never revoked, %ds left); queue now %v",
			round, name, dead, lease, remaining, left)
		return
	}
}

// A turn handed to a waiter that gives up is passed on, also when the
// waiter's context ends during takeOver (etcd slow for a moment) rather
// than inside queue.Wait: the hold goes to the next local waiter, which
// has budget left, instead of being forgotten (its key deleted, an empty
// turn for the next local waiter, which would queue at the END of etcd's
// queue, behind the other process).
//
// Schedule: Q0 holds; P1 queues in etcd behind it; P2 (ctx 3s) and P3 queue
// locally; Q0 releases: P1 holds with budget 2. Q1 queues behind P's key.
// P's link freezes. P1 releases: Pass hands the hold to P2; P2's takeOver
// Txn hangs until P2's deadline; takeOver fails, and the hold is passed on
// to P3. Hold order P1 P3 Q1 (a forgotten hold would give P1 Q1 P3).
func TestHandOverPassedOnWhenTheWaiterGivesUpInTakeOver(t *testing.T) {
	cluster := testetcd.Start(t)
	cli := cluster.Client(t)
	pcli, plink := proxiedClient(t, cluster)
	p := newLocker(t, pcli, etcdlock.WithTTL(5*time.Second))
	q := newLocker(t, cluster.Client(t))
	order := make(chan string, 4)

	q0, err := q.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	p1c := acquireAsync(p, t.Context(), "k")
	pKey := queueKeys(t, cli, p, "k", 2)[1]
	p2ctx, p2cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer p2cancel()
	p2c := acquireAsync(p, p2ctx, "k")
	for p.LocalWaiting("k") < 1 {
		runtime.Gosched()
	}
	p3c := make(chan acquireResult, 1)
	p3ctx, p3cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer p3cancel()
	go func() {
		le, err := p.Acquire(p3ctx, "k")
		if err == nil {
			order <- "p3"
			err = le.Release(context.Background())
		}
		p3c <- acquireResult{le, err}
	}()
	for p.LocalWaiting("k") < 2 {
		runtime.Gosched()
	}
	if err := q0.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	r1 := <-p1c
	if r1.err != nil {
		t.Fatal(r1.err)
	}
	order <- "p1"
	q1c := make(chan error, 1)
	q1ctx, q1cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer q1cancel()
	go func() {
		le, err := q.Acquire(q1ctx, "k")
		if err == nil {
			order <- "q1"
			err = le.Release(context.Background())
		}
		q1c <- err
	}()
	if keys := queueKeys(t, cli, q, "k", 2); keys[0] != pKey {
		t.Fatalf("queue %v, want p's key first", keys)
	}
	// A place of P's batch at or below the fence is not handed on: P2's
	// takeOver must write the key again, a call to etcd.
	if err := p.AdvanceFence(t.Context(), "k", r1.le.Token()+1); err != nil {
		t.Fatal(err)
	}
	plink.Freeze()
	t.Cleanup(plink.Thaw)
	if err := r1.le.Release(t.Context()); err != nil { // a local hand-over: no call to etcd
		t.Fatal(err)
	}
	r2 := <-p2c // its takeOver hangs until its deadline
	if r2.err == nil {
		t.Fatal("p2 got the lock through a frozen link")
	}
	plink.Thaw()
	if err := <-q1c; err != nil {
		t.Fatal(err)
	}
	if r3 := <-p3c; r3.err != nil {
		t.Fatal(r3.err)
	}
	close(order)
	var got []string
	for who := range order {
		got = append(got, who)
	}
	if fmt.Sprint(got) != "[p1 p3 q1]" {
		t.Errorf("hold order %v: the hold P1 handed to P2, who gave up during takeOver, was not passed on to P3 (want [p1 p3 q1])", got)
	}
}

// TestResetAllEndsTheHoldersOfEveryName: ResetAll of 300 names, three of
// etcd's transactions of 128 deletes, deletes every name's queue as Reset
// does one: the holders of a name in the first, the second and the last
// transaction lose their leases, and another process takes each lock.
func TestResetAllEndsTheHoldersOfEveryName(t *testing.T) {
	cluster := testetcd.Start(t)
	p := newLocker(t, cluster.Client(t))
	q := newLocker(t, cluster.Client(t))
	names := make([]string, 300)
	for i := range names {
		names[i] = fmt.Sprintf("sku-%03d", i)
	}
	var held []*etcdlock.Lease
	for _, i := range []int{0, 150, 299} {
		le, err := p.Acquire(t.Context(), names[i])
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, le)
	}
	if err := q.ResetAll(t.Context(), names); err != nil {
		t.Fatal(err)
	}
	for j, i := range []int{0, 150, 299} {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		other, err := q.Acquire(ctx, names[i])
		cancel()
		if err != nil {
			t.Fatalf("%s after ResetAll: %v", names[i], err)
		}
		// p learns of the reset from its watch, a moment after q may
		// already hold the name (the fence guards that moment): its
		// lease must end soon, not before q's Acquire returns.
		select {
		case <-held[j].Context().Done():
		case <-time.After(5 * time.Second):
			t.Errorf("5 s after ResetAll, while q holds %s, p's lease of it still has a live Context", names[i])
		}
		_ = other.Release(context.Background())
		_ = held[j].Release(context.Background())
	}
}
