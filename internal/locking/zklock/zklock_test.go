package zklock_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"

	"github.com/flashsale/stock/internal/locking"
	"github.com/flashsale/stock/internal/locking/zklock"
	"github.com/flashsale/stock/lab/testzk"
)

func uniqueName(tb testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return strings.ReplaceAll(tb.Name(), "/", "_") + "-" + hex.EncodeToString(b[:])
}

func acquire(t *testing.T, l *zklock.Locker, ctx context.Context, name string) *zklock.Lease {
	t.Helper()
	// The bound cancels only the wait, never the lease it gave (the
	// lease's context derives from actx).
	actx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	timer := time.AfterFunc(10*time.Second, cancel)
	le, err := l.Acquire(actx, name)
	timer.Stop()
	if err != nil {
		t.Fatalf("acquire %s: %v", name, err)
	}
	return le
}

func release(t *testing.T, le *zklock.Lease) {
	t.Helper()
	if err := le.Release(context.Background()); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// result is what a background Acquire got.
type result struct {
	le  *zklock.Lease
	err error
}

// acquireAsync acquires on a goroutine of the test's, joined at its end.
func acquireAsync(t *testing.T, l *zklock.Locker, ctx context.Context, name string) <-chan result {
	ch := make(chan result, 1)
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	// A deadline, not WithWait's bound, ends the wait; the lease's context
	// derives from actx, so it is cancelled only at t's end.
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	t.Cleanup(cancel)
	wg.Go(func() {
		le, err := l.Acquire(actx, name)
		ch <- result{le, err}
	})
	return ch
}

func got(t *testing.T, ch <-chan result) *zklock.Lease {
	t.Helper()
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.le
}

// watching returns a hook for SetWatchHook and a channel of the
// predecessors watched.
func watching() (func(node, pred string), <-chan string) {
	ch := make(chan string, 16)
	return func(_, pred string) { ch <- pred }, ch
}

// lockChildren lists the lock nodes of name, lowest first.
func lockChildren(t *testing.T, l *zklock.Locker, name string) []string {
	t.Helper()
	children, _, err := l.Conn().Children(l.Dir(name))
	if err != nil {
		t.Fatal(err)
	}
	var locks []string
	for _, c := range children {
		if strings.Contains(c, "-lock-") {
			locks = append(locks, c)
		}
	}
	slices.SortFunc(locks, func(a, b string) int { return strings.Compare(a[len(a)-10:], b[len(b)-10:]) })
	return locks
}

// TestLostCreateAnswerIsFoundAgain: a create whose answer is lost with the
// connection was applied all the same; the contender finds its node by the
// GUID in its name instead of creating a second one, which would be an
// orphan holding the lock until the session ends.
func TestLostCreateAnswerIsFoundAgain(t *testing.T) {
	srv := testzk.Start(t)
	l := newLocker(t, []string{srv.Addr})
	lost := 0
	l.SetCreateHook(func(path string, err error) (string, error) {
		if err == nil && lost == 0 {
			lost++
			return "", zk.ErrConnectionClosed
		}
		return path, err
	})
	name := uniqueName(t)
	le := acquire(t, l, t.Context(), name)
	if lost != 1 {
		t.Fatal("the hook did not lose an answer")
	}
	if locks := lockChildren(t, l, name); len(locks) != 1 {
		t.Fatalf("lock nodes %v, want exactly the one created", locks)
	}
	release(t, le)
	if locks := lockChildren(t, l, name); len(locks) != 0 {
		t.Fatalf("lock nodes %v left after the release", locks)
	}
}

// TestWaitersWatchOnlyTheirPredecessor: each waiter watches the node just
// below its own; a release wakes the next one only, and a waiter whose
// predecessor gave up looks again and watches the holder.
func TestWaitersWatchOnlyTheirPredecessor(t *testing.T) {
	srv := testzk.Start(t)
	name := uniqueName(t)
	a := newLocker(t, []string{srv.Addr})
	b := newLocker(t, []string{srv.Addr})
	c := newLocker(t, []string{srv.Addr})
	d := newLocker(t, []string{srv.Addr})
	bHook, bWatched := watching()
	cHook, cWatched := watching()
	dHook, dWatched := watching()
	b.SetWatchHook(bHook)
	c.SetWatchHook(cHook)
	d.SetWatchHook(dHook)

	held := acquire(t, a, t.Context(), name)
	bCtx, cancelB := context.WithCancel(t.Context())
	bRes := acquireAsync(t, b, bCtx, name)
	predOfB := <-bWatched
	cRes := acquireAsync(t, c, t.Context(), name)
	predOfC := <-cWatched
	dRes := acquireAsync(t, d, t.Context(), name)
	predOfD := <-dWatched
	locks := lockChildren(t, a, name)
	if len(locks) != 4 {
		t.Fatalf("lock nodes %v, want 4", locks)
	}
	for i, pred := range []string{predOfB, predOfC, predOfD} {
		if !strings.HasSuffix(pred, "/"+locks[i]) {
			t.Fatalf("waiter %d watches %s, want its predecessor %s", i+1, pred, locks[i])
		}
	}

	// B gives up: C, who watched B, looks again and watches A, the holder;
	// D, who watched C, hears nothing.
	cancelB()
	if r := <-bRes; !errors.Is(r.err, locking.ErrNotObtained) || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("B's cancelled wait: %v", r.err)
	}
	if pred := <-cWatched; !strings.HasSuffix(pred, "/"+locks[0]) {
		t.Fatalf("after B left, C watches %s, want the holder %s", pred, locks[0])
	}
	if n := d.WatchesFired(); n != 0 {
		t.Fatalf("D was woken %d times by others' moves", n)
	}

	// A releases: C holds; D, still behind C, was not woken.
	release(t, held)
	cLease := got(t, cRes)
	if n := d.WatchesFired(); n != 0 {
		t.Fatalf("the release woke D (%d wake-ups), who waits behind C: a herd", n)
	}
	if n := c.WatchesFired(); n != 2 {
		t.Fatalf("C was woken %d times, want 2 (B left, A released)", n)
	}
	release(t, cLease)
	release(t, got(t, dRes))
	if n := d.WatchesFired(); n != 1 {
		t.Fatalf("D was woken %d times, want 1", n)
	}
}

// TestLocalHandOverAfterAnotherProcessQueued is the schedule that a token
// from the node's creation zxid gets wrong: process P's goroutine g1 gets
// the lock from ZooKeeper while g2 of P waits behind it and process Q has
// queued in ZooKeeper after P; g1 hands P's node to g2. g2's token must
// exceed g1's, and Q's, after g2, must exceed g2's.
func TestLocalHandOverAfterAnotherProcessQueued(t *testing.T) {
	srv := testzk.Start(t)
	name := uniqueName(t)
	first := newLocker(t, []string{srv.Addr})
	p := newLocker(t, []string{srv.Addr})
	q := newLocker(t, []string{srv.Addr})
	pHook, pWatched := watching()
	qHook, qWatched := watching()
	p.SetWatchHook(pHook)
	q.SetWatchHook(qHook)

	h0 := acquire(t, first, t.Context(), name)
	g1 := acquireAsync(t, p, t.Context(), name)
	<-pWatched
	g2 := acquireAsync(t, p, t.Context(), name)
	for p.LocalWaiters(name) != 1 {
		runtime.Gosched()
	}
	qRes := acquireAsync(t, q, t.Context(), name)
	<-qWatched

	tokens := []int64{h0.Token()}
	release(t, h0)
	l1 := got(t, g1)
	tokens = append(tokens, l1.Token())
	release(t, l1)
	// g2 holds while Q still waits in ZooKeeper behind P's node: it came by
	// hand-over (had g1 deleted the node, Q would have been first).
	l2 := got(t, g2)
	tokens = append(tokens, l2.Token())
	if l2.Node() != l1.Node() {
		t.Fatalf("g2 holds on %s, g1 held on %s: no hand-over", l2.Node(), l1.Node())
	}
	select {
	case r := <-qRes:
		t.Fatalf("Q got the lock (%v) while P's g2 holds it", r.err)
	default:
	}
	release(t, l2)
	lq := got(t, qRes)
	tokens = append(tokens, lq.Token())
	release(t, lq)
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("tokens %v: holder %d's is not above its predecessor's", tokens, i)
		}
	}
}

// TestAdvanceFence: every token after AdvanceFence(x) is above x: every
// batch's (its token write reads the new base), and every place this
// process hands on after its own AdvanceFence
// (TestPlacesAtOrBelowTheFenceAreNotHandedOn). A place another process hands on from a batch
// it began before may be below x: the store refuses it, and that process
// advances the fence in turn. A lower value changes nothing, and tokens
// keep growing.
func TestAdvanceFence(t *testing.T) {
	srv := testzk.Start(t)
	name := uniqueName(t)
	l := newLocker(t, []string{srv.Addr})
	other := newLocker(t, []string{srv.Addr})
	ctx := t.Context()

	le := acquire(t, l, ctx, name)
	t0 := le.Token()
	release(t, le)
	target := t0 + 1_000_000
	if err := other.AdvanceFence(ctx, name, target); err != nil {
		t.Fatal(err)
	}
	le = acquire(t, l, ctx, name)
	t1 := le.Token()
	if t1 <= target {
		t.Fatalf("token %d after AdvanceFence(%d)", t1, target)
	}
	// Another process advances the fence while l holds with a local
	// waiter: l hands on the next place of its batch; the batch after it
	// is above the new fence.
	next := acquireAsync(t, l, ctx, name)
	for l.LocalWaiters(name) != 1 {
		runtime.Gosched()
	}
	target2 := t1 + 5_000_000
	if err := other.AdvanceFence(ctx, name, target2); err != nil {
		t.Fatal(err)
	}
	release(t, le)
	le = got(t, next)
	t2 := le.Token()
	if t2 <= t1 {
		t.Fatalf("token %d handed over after %d", t2, t1)
	}
	release(t, le)
	le = acquire(t, other, ctx, name)
	t3 := le.Token()
	if t3 <= target2 || t3 <= t2 {
		t.Fatalf("token %d of the next batch after AdvanceFence(%d) and the hand-over's %d", t3, target2, t2)
	}
	release(t, le)
	if err := other.AdvanceFence(ctx, name, 5); err != nil {
		t.Fatal(err)
	}
	le = acquire(t, other, ctx, name)
	if le.Token() <= t3 {
		t.Fatalf("token %d after %d and a lower AdvanceFence", le.Token(), t3)
	}
	release(t, le)
}

// TestResetKeepsTheHolder: Reset never frees a held lock; the holder keeps
// it, others still wait, and the tokens after it keep growing.
func TestResetKeepsTheHolder(t *testing.T) {
	srv := testzk.Start(t)
	name := uniqueName(t)
	l := newLocker(t, []string{srv.Addr})
	other := newLocker(t, []string{srv.Addr})
	ctx := t.Context()

	held := acquire(t, l, ctx, name)
	// A local waiter, which would be handed the lock: Reset ends the
	// chain, so it goes to ZooKeeper, and gets the lock all the same.
	local := acquireAsync(t, l, ctx, name)
	for l.LocalWaiters(name) != 1 {
		runtime.Gosched()
	}
	if err := other.Reset(ctx, name); err != nil {
		t.Fatal(err)
	}
	if err := l.Reset(ctx, name); err != nil {
		t.Fatal(err)
	}
	if err := held.Context().Err(); err != nil {
		t.Fatalf("Reset ended the holder's lease: %v", context.Cause(held.Context()))
	}
	bctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := other.Acquire(bctx, name)
	cancel()
	if !errors.Is(err, locking.ErrNotObtained) {
		t.Fatalf("another process's Acquire during the hold after Reset: %v, want ErrNotObtained", err)
	}
	release(t, held)
	next := got(t, local)
	if next.Node() == held.Node() {
		t.Fatal("the local waiter was handed the lock across a Reset")
	}
	if next.Token() <= held.Token() {
		t.Fatalf("token %d after Reset, %d before", next.Token(), held.Token())
	}
	release(t, next)
}

// TestCloseJoinsEverything: Close ends a local waiter and a holder's lease,
// frees the lock for other processes and leaves no goroutine behind.
func TestCloseJoinsEverything(t *testing.T) {
	srv := testzk.Start(t)
	name := uniqueName(t)
	other := newLocker(t, []string{srv.Addr})
	// other's client starts its connection's goroutines once connected.
	release(t, acquire(t, other, t.Context(), name))
	ignore := goleak.IgnoreCurrent()

	l, err := zklock.New([]string{srv.Addr}, zklock.WithSessionTimeout(sessionTimeout), zklock.WithLogger(zklock.Quiet()))
	if err != nil {
		t.Fatal(err)
	}
	held := acquire(t, l, t.Context(), name)
	localWaiter := acquireAsync(t, l, t.Context(), name)
	for l.LocalWaiters(name) != 1 {
		runtime.Gosched()
	}
	otherWaiter := acquireAsync(t, other, t.Context(), name)

	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if r := <-localWaiter; !errors.Is(r.err, locking.ErrNotObtained) || !errors.Is(r.err, locking.ErrClosed) {
		t.Fatalf("a waiter at Close got %v, want ErrNotObtained and ErrClosed", r.err)
	}
	if cause := context.Cause(held.Context()); !errors.Is(cause, locking.ErrLockLost) || !errors.Is(cause, locking.ErrClosed) {
		t.Fatalf("the held lease's context ended with %v, want ErrLockLost and ErrClosed", cause)
	}
	if err := held.Release(context.Background()); !errors.Is(err, locking.ErrLockLost) {
		t.Fatalf("Release after Close = %v, want ErrLockLost", err)
	}
	if _, err := l.Acquire(t.Context(), name); !errors.Is(err, locking.ErrClosed) {
		t.Fatalf("Acquire after Close = %v, want ErrClosed", err)
	}
	// The closed session took its node along: the other process holds.
	release(t, got(t, otherWaiter))
	if err := goleak.Find(ignore); err != nil {
		t.Fatal(err)
	}
}

// TestServerDownIsANodeError: with the server gone Acquire fails soon with
// a locking.NodeError (the service answers 503, not "busy"): after the
// rounds of dials its attempts wait out (obtain: about 4 rounds, each
// ending in the client's 1 s back-off), well before its 10 s deadline.
func TestServerDownIsANodeError(t *testing.T) {
	srv := testzk.StartOwn(t) // stopped: never a ZK_SERVERS one
	l := newLocker(t, []string{srv.Addr})
	name := uniqueName(t)
	release(t, acquire(t, l, t.Context(), name))
	srv.Stop()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	began := time.Now()
	_, err := l.Acquire(ctx, name)
	var ne *locking.NodeError
	if !errors.As(err, &ne) || !errors.Is(err, locking.ErrNotObtained) {
		t.Fatalf("Acquire with the server down = %v, want ErrNotObtained and a NodeError", err)
	}
	if waited := time.Since(began); waited > 8*time.Second {
		t.Fatalf("Acquire with the server down took %v", waited)
	}
}

// TestExpiredWaiterFails: a waiter whose session expires while it waits
// fails with the expiry, instead of hanging on a node that is gone, and the
// client works again on its new session.
func TestExpiredWaiterFails(t *testing.T) {
	srv := testzk.Start(t)
	name := uniqueName(t)
	holder := newLocker(t, []string{srv.Addr})
	waiter, link := proxied(t, srv)
	hook, watched := watching()
	waiter.SetWatchHook(hook)

	held := acquire(t, holder, t.Context(), name)
	res := acquireAsync(t, waiter, t.Context(), name)
	<-watched
	// Cut the waiter off until the server has expired its session, which
	// deletes its node: watch the folder from the holder's session.
	link.Freeze()
	for {
		children, _, ch, err := holder.Conn().ChildrenW(holder.Dir(name))
		if err != nil {
			t.Fatal(err)
		}
		if n := len(slices.DeleteFunc(children, func(c string) bool { return !strings.Contains(c, "-lock-") })); n == 1 {
			break
		}
		<-ch
	}
	link.Thaw()
	r := <-res
	if !errors.Is(r.err, locking.ErrNotObtained) || !errors.Is(r.err, zk.ErrSessionExpired) {
		t.Fatalf("a waiter whose session expired got %v, want ErrNotObtained and zk.ErrSessionExpired", r.err)
	}
	release(t, held)
	release(t, acquire(t, waiter, t.Context(), name))
}

// TestReleaseAfterSuspension: a holder whose connection drops loses its
// lease at once (SUSPENDED); its Release reports the loss, even when the
// session survived, and frees the lock for the others.
func TestReleaseAfterSuspension(t *testing.T) {
	srv := testzk.Start(t)
	name := uniqueName(t)
	l, link := proxied(t, srv)
	other := newLocker(t, []string{srv.Addr})
	held := acquire(t, l, t.Context(), name)
	local := acquireAsync(t, l, t.Context(), name)
	for l.LocalWaiters(name) != 1 {
		runtime.Gosched()
	}
	hook, watched := watching()
	other.SetWatchHook(hook)
	otherRes := acquireAsync(t, other, t.Context(), name)
	<-watched  // queued in ZooKeeper
	link.Cut() // the connection drops; the client reconnects within the session
	<-held.Context().Done()
	if cause := context.Cause(held.Context()); !errors.Is(cause, locking.ErrLockLost) {
		t.Fatalf("cause %v, want ErrLockLost", cause)
	}
	if err := held.Release(context.Background()); !errors.Is(err, locking.ErrLockLost) {
		t.Fatalf("Release = %v, want ErrLockLost", err)
	}
	// The suspended hold was not handed on: the local waiter queues in
	// ZooKeeper behind the other process, which holds next.
	le := got(t, otherRes)
	if le.Token() <= held.Token() {
		t.Fatalf("token %d after %d", le.Token(), held.Token())
	}
	release(t, le)
	next := got(t, local)
	if next.Node() == held.Node() {
		t.Fatal("a suspended hold was handed on")
	}
	release(t, next)
}

// batch makes l's goroutines a batch of 1 + locals holders of name: the
// first waits in ZooKeeper behind another process's hold while locals
// more queue behind it in l. Calling begin releases the other hold, so l
// gets the lock with locals waiters; it returns the first holder's lease
// and the others' results, in queue order.
func batch(t *testing.T, srv *testzk.Server, l *zklock.Locker, name string, locals int) (begin func() (*zklock.Lease, []<-chan result)) {
	t.Helper()
	blocker := newLocker(t, []string{srv.Addr})
	h0 := acquire(t, blocker, t.Context(), name)
	hook, watched := watching()
	l.SetWatchHook(hook)
	first := acquireAsync(t, l, t.Context(), name)
	<-watched
	var rest []<-chan result
	for i := range locals {
		rest = append(rest, acquireAsync(t, l, t.Context(), name))
		for l.LocalWaiters(name) != i+1 {
			runtime.Gosched()
		}
	}
	return func() (*zklock.Lease, []<-chan result) {
		release(t, h0)
		return got(t, first), rest
	}
}

// TestBatchHandsOnPlaces: a batch's local hand-overs take the next
// places of its token, one after the other, without a write of their own;
// a holder after the batch, in another process, gets a token above them.
func TestBatchHandsOnPlaces(t *testing.T) {
	srv := testzk.Start(t)
	name := uniqueName(t)
	p := newLocker(t, []string{srv.Addr})
	q := newLocker(t, []string{srv.Addr})
	begin := batch(t, srv, p, name, 3)
	writesBefore := tokenWrites(t, p, name)
	le, rest := begin()
	tokens := []int64{le.Token()}
	qRes := acquireAsync(t, q, t.Context(), name) // queues in ZooKeeper behind P's batch
	for _, r := range rest {
		release(t, le)
		le = got(t, r)
		tokens = append(tokens, le.Token())
	}
	if n := tokenWrites(t, p, name) - writesBefore; n != 1 {
		t.Fatalf("%d token writes for a batch of %d holders, want 1", n, len(tokens))
	}
	release(t, le)
	for i := 1; i < len(tokens); i++ {
		if tokens[i] != tokens[i-1]+1 {
			t.Fatalf("batch tokens %v: hand-over %d did not take the next place", tokens, i)
		}
	}
	lq := got(t, qRes)
	if lq.Token() <= tokens[len(tokens)-1] {
		t.Fatalf("token %d after the batch's %v", lq.Token(), tokens)
	}
	release(t, lq)
}

// TestPlacesAtOrBelowTheFenceAreNotHandedOn: after AdvanceFence in
// this process, a hand-over does not take a place at or below the new
// fence: its holder takes the batch's first place above it (here: the
// fence is inside the batch), or makes a token write if there is none.
func TestPlacesAtOrBelowTheFenceAreNotHandedOn(t *testing.T) {
	srv := testzk.Start(t)
	name := uniqueName(t)
	l := newLocker(t, []string{srv.Addr})
	le, rest := batch(t, srv, l, name, 1)()
	target := le.Token() + 1_000
	if err := l.AdvanceFence(t.Context(), name, target); err != nil {
		t.Fatal(err)
	}
	release(t, le)
	le = got(t, rest[0])
	if le.Token() <= target {
		t.Fatalf("token %d handed on after AdvanceFence(%d)", le.Token(), target)
	}
	release(t, le)
}

// TestPlacesExpireWithTheirWrite: a hand-over later than a third
// of the session timeout after the batch's write does not trust the
// session on it: its holder writes again (the time itself is under test).
func TestPlacesExpireWithTheirWrite(t *testing.T) {
	srv := testzk.Start(t)
	name := uniqueName(t)
	const session = 1500 * time.Millisecond
	l := newLocker(t, []string{srv.Addr}, zklock.WithSessionTimeout(session))
	le, rest := batch(t, srv, l, name, 1)()
	t0 := le.Token()
	time.Sleep(session/3 + 50*time.Millisecond)
	before := tokenWrites(t, l, name)
	release(t, le)
	le = got(t, rest[0])
	if n := tokenWrites(t, l, name) - before; n != 1 {
		t.Fatalf("%d token writes for the holder handed the lock past a third of the session timeout, want 1", n)
	}
	if le.Token() <= t0 {
		t.Fatalf("token %d after %d", le.Token(), t0)
	}
	release(t, le)
}

// tokenWrites counts the writes to name's fence node and token nodes so
// far (their data versions).
func tokenWrites(t *testing.T, l *zklock.Locker, name string) int {
	t.Helper()
	children, _, err := l.Conn().Children(l.Dir(name))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range children {
		if c != "fence" && !strings.HasPrefix(c, "token-") {
			continue
		}
		_, st, err := l.Conn().Exists(l.Dir(name) + "/" + c)
		if err != nil {
			t.Fatal(err)
		}
		if st != nil {
			n += int(st.Version)
		}
	}
	return n
}

// TestResetAllEndsTheHandOverChainOfEveryName: ResetAll of several names
// does for each what Reset does for one: the holder keeps its lock, and
// the local waiter behind it goes to ZooKeeper's queue instead of being
// handed the lock.
func TestResetAllEndsTheHandOverChainOfEveryName(t *testing.T) {
	srv := testzk.Start(t)
	l := newLocker(t, []string{srv.Addr})
	other := newLocker(t, []string{srv.Addr})
	ctx := t.Context()
	names := []string{uniqueName(t) + "-a", uniqueName(t) + "-b", uniqueName(t) + "-c"}
	held := map[string]*zklock.Lease{}
	locals := map[string]<-chan result{}
	for _, name := range names[:2] {
		held[name] = acquire(t, l, ctx, name)
		locals[name] = acquireAsync(t, l, ctx, name)
		for l.LocalWaiters(name) != 1 {
			runtime.Gosched()
		}
	}
	if err := l.ResetAll(ctx, names); err != nil {
		t.Fatal(err)
	}
	if err := other.ResetAll(ctx, names); err != nil {
		t.Fatal(err)
	}
	for _, name := range names[:2] {
		if err := held[name].Context().Err(); err != nil {
			t.Fatalf("ResetAll ended the holder's lease of %s: %v", name, context.Cause(held[name].Context()))
		}
		release(t, held[name])
		next := got(t, locals[name])
		if next.Node() == held[name].Node() {
			t.Errorf("the local waiter of %s was handed the lock across a ResetAll", name)
		}
		release(t, next)
	}
}
