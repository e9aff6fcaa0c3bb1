package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/flashsale/stock/internal/locking"
	"github.com/flashsale/stock/internal/locking/handoff"
)

// Locker hands out locks on etcd. It is safe for concurrent use; one per
// process is the intended use (it holds the process's session).
type Locker struct {
	client *clientv3.Client
	cfg    config
	queue  *handoff.Queue[*hold]
	seq    atomic.Int64

	grant    chan struct{} // one lease grant at a time; a waiter's context ends its wait for it
	mu       sync.Mutex
	sess     *session // nil until needed, and after it was lost
	closed   bool
	closeCtx context.Context // ends at Close: every wait, every watch
	closeAll context.CancelFunc
	wg       sync.WaitGroup

	parked  func(predecessor string)       // tests: a waiter's watch is in place and its predecessor key still there
	onToken func(name string, token int64) // tests: a holder took its token; its lease has not begun

	names map[string]*nameState // the names in use in this process; guarded by mu
}

// nameState is what this process keeps for a name while the name is in
// use, and only then: a process that locks every SKU of a catalog keeps
// nothing for the idle ones.
type nameState struct {
	// users counts the Acquires of the name in progress, the holders that
	// have not released it, and the AdvanceFences running: a hold of this
	// process can be handed on only while one of them lasts.
	users int
	// floor is AdvanceFence's highest atLeast: places handed on must be
	// above it. A name without users has no batch left to hand places of,
	// and every later batch begins above the fence AdvanceFence raised.
	floor int64
}

// New returns a Locker over client. Close it to end its session; the
// client stays the caller's.
func New(client *clientv3.Client, opts ...Option) *Locker {
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	closeCtx, closeAll := context.WithCancel(context.Background())
	return &Locker{client: client, cfg: cfg, queue: handoff.New[*hold](), grant: make(chan struct{}, 1),
		closeCtx: closeCtx, closeAll: closeAll, names: make(map[string]*nameState)}
}

// Acquire waits for the lock on name and returns its lease. A wait that
// ends (the context, WithWait, Close) returns an error wrapping
// locking.ErrNotObtained and the reason; a failure of etcd is a
// locking.NodeError in it.
func (l *Locker) Acquire(ctx context.Context, name string) (*Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(locking.ErrNotObtained, err)
	}
	if err := validName(name); err != nil {
		return nil, errors.Join(locking.ErrNotObtained, err)
	}
	if h, ok := locking.HoldOf[*hold](ctx, l, name); ok {
		if le := l.reenter(ctx, h); le != nil {
			return le, nil
		}
	}
	// The name's state lives until the lease is released (Release ends
	// this use), or until the acquisition fails.
	l.use(name)
	le, err := l.acquire(ctx, name)
	if err != nil {
		l.done(name)
	}
	return le, err
}

// use counts one more user of name's state, creating it if need be. Every
// use ends with done.
func (l *Locker) use(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ns := l.names[name]
	if ns == nil {
		ns = &nameState{}
		l.names[name] = ns
	}
	ns.users++
}

// done ends a use of name; the last one drops the name's state.
func (l *Locker) done(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ns := l.names[name]; ns != nil {
		if ns.users--; ns.users <= 0 {
			delete(l.names, name)
		}
	}
}

// floor is name's fence floor (nameState.floor); 0 when it has no state.
func (l *Locker) floor(name string) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ns := l.names[name]; ns != nil {
		return ns.floor
	}
	return 0
}

// aboveFloor reports whether h's token is above name's fence floor as it
// is now, under the lock AdvanceFence raises the floor under: this check is
// the moment a lease begins, so an AdvanceFence that returned before it is
// honoured, whatever floor the token was taken with. AdvanceFence raises
// the floor only once the fence base is raised, so a token taken after a
// false here, by a write, is above it.
func (l *Locker) aboveFloor(h *hold) bool {
	return h.token > l.floor(h.name)
}

// raiseFloor makes this process hand on no place of name at or below
// atLeast, and begin no lease with such a token (aboveFloor).
func (l *Locker) raiseFloor(name string, atLeast int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ns := l.names[name]; ns != nil {
		ns.floor = max(ns.floor, atLeast)
	}
}

// acquire is Acquire's wait and hold, within a use of name.
func (l *Locker) acquire(ctx context.Context, name string) (*Lease, error) {
	wctx, cancel := l.waitContext(ctx)
	defer cancel()
	turn, err := l.queue.Wait(wctx, name, func(t handoff.Turn[*hold]) { l.endTurn(t.Hold, name) })
	if err != nil {
		return nil, l.notObtained(wctx, nil)
	}
	h := turn.Hold
	handed, retake := turn.Handed, turn.Handed
	for {
		if retake {
			if err := l.takeOver(wctx, h); err != nil {
				if wctx.Err() != nil {
					// We gave up while taking over: the key is still good
					// for the next waiter of this process.
					l.endTurn(h, name)
					return nil, l.notObtained(wctx, err)
				}
				// The key went (with its session, or deleted): take the
				// lock anew.
				l.deleteKey(h)
				h, handed = nil, false
			}
		}
		if h == nil {
			if h, err = l.acquireRemote(wctx, name); err != nil {
				l.queue.Done(name)
				return nil, l.notObtained(wctx, err)
			}
			h.budget = l.queue.Waiting(name)
		}
		if l.onToken != nil {
			l.onToken(name, h.token)
		}
		if l.aboveFloor(h) {
			break
		}
		// An AdvanceFence returned after the floor was read: the token,
		// a place chosen above the old floor or a base read before the
		// new one, is not used. Take the next above the floor: a place
		// of the batch, or a write of the key (still ours), which lands
		// above it.
		retake = true
	}
	if handed {
		h.budget-- // the hand-over that gave us h
	}
	h.mu.Lock()
	h.count = 1
	h.mu.Unlock()
	return l.newLease(ctx, h), nil
}

// validName refuses names whose queue would lie inside another's: the
// queue of "a/b" is a prefix range under that of "a".
func validName(name string) error {
	if name == "" || strings.Contains(name, "/") {
		return fmt.Errorf("etcdlock: lock name %q must be non-empty and without '/'", name)
	}
	return nil
}

// waitContext bounds a wait: WithWait, else the caller's deadline, else
// twice the TTL. Close ends it too.
func (l *Locker) waitContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return locking.WaitContext(ctx, l.cfg.wait, 2*l.cfg.ttl, l.closeCtx)
}

// notObtained is the error of a wait that ended without the lock:
// locking.NotObtained, and the cause the caller cancelled its context with
// (context.WithCancelCause), if it gave one, which says why the wait ended
// ("not obtained within 5s"): locking.NotObtained reports only ctx.Err().
// Close, the other cause a wait can have, NotObtained reports itself.
func (l *Locker) notObtained(wctx context.Context, err error) error {
	return locking.NotObtained(wctx, l.closeCtx, err)
}

// Release gives the lease up. The last lease of a hold passes the lock to
// the next goroutine of this process that waits for it, while the hold's
// budget lasts; otherwise it deletes the key (only if it is still the
// hold's) under context.WithoutCancel(ctx) and WithOpTimeout. It returns
// locking.ErrNotHeld for a second Release, and an error wrapping
// locking.ErrLockLost when the lock had been lost.
func (le *Lease) Release(ctx context.Context) error {
	if !le.released.CompareAndSwap(false, true) {
		return locking.ErrNotHeld
	}
	le.stopLoss()
	le.cancel(context.Canceled)
	h, l := le.h, le.l
	h.mu.Lock()
	h.count--
	last := h.count == 0
	h.mu.Unlock()
	lost := h.keyCtx.Err() != nil
	if !last {
		if lost {
			return context.Cause(h.keyCtx)
		}
		return nil
	}
	defer l.done(h.name) // Acquire's use
	if !lost && h.budget > 0 && l.queue.Pass(h.name, h.handOn()) {
		return nil
	}
	err := l.deleteNow(ctx, h)
	l.queue.Done(h.name)
	if lost {
		return context.Cause(h.keyCtx)
	}
	return err
}

// endTurn ends the turn of a waiter that gave up as the lock was handed to
// it: pass it on, or give the lock back.
func (l *Locker) endTurn(h *hold, name string) {
	if h != nil && h.keyCtx.Err() == nil && l.queue.Pass(name, h.handOn()) {
		return
	}
	if h != nil {
		_ = l.deleteNow(context.Background(), h)
	}
	l.queue.Done(name)
}

// LocalWaiting reports how many goroutines of this process wait behind
// name's local holder.
func (l *Locker) LocalWaiting(name string) int { return l.queue.Waiting(name) }

// Reset clears name's queue for a new sale: every key in it is deleted, so
// a holder of the old sale loses the lock (its release reports
// locking.ErrLockLost; the version bump of the new sale and its token keep
// its late write out) and waiters queue again. Tokens keep growing: they
// come from etcd's revision.
func (l *Locker) Reset(ctx context.Context, name string) error {
	if _, err := l.client.Delete(ctx, l.queueDir(name), clientv3.WithPrefix()); err != nil {
		return l.nodeError(fmt.Errorf("reset %s: %w", name, err))
	}
	return nil
}

// maxTxnOps is etcd's default bound on the operations of one transaction
// (--max-txn-ops, 128): ResetAll deletes at most this many queues a
// transaction.
const maxTxnOps = 128

// resetWidth is how many of ResetAll's transactions run at once.
const resetWidth = 8

// ResetAll is Reset for many names (a catalog's new sales): their queues
// are deleted by transactions of up to 128 prefix deletes each, a few at
// once, instead of a round trip and a raft commit per name (10,000 names
// took 1.1-1.5 s one at a time, 32 at once).
func (l *Locker) ResetAll(ctx context.Context, names []string) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(resetWidth)
	for chunk := range slices.Chunk(names, maxTxnOps) {
		g.Go(func() error {
			ops := make([]clientv3.Op, len(chunk))
			for i, name := range chunk {
				ops[i] = clientv3.OpDelete(l.queueDir(name), clientv3.WithPrefix())
			}
			if _, err := l.client.Txn(gctx).Then(ops...).Commit(); err != nil {
				return l.nodeError(fmt.Errorf("reset %d names from %s: %w", len(chunk), chunk[0], err))
			}
			return nil
		})
	}
	return g.Wait()
}

// Close ends every wait (locking.ErrClosed), stops the session's renewals,
// revokes its lease (which deletes this process's keys: locks still held
// are lost) and waits for every goroutine the Locker started.
func (l *Locker) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return locking.ErrClosed
	}
	l.closed = true
	l.closeAll()
	s := l.sess
	l.sess = nil
	l.mu.Unlock()
	var err error
	if s != nil {
		close(s.stop)
		<-s.ended
		s.cancel(fmt.Errorf("%w: %w", locking.ErrLockLost, locking.ErrClosed))
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.opTimeout)
		if _, rerr := l.client.Revoke(ctx, s.id); rerr != nil {
			err = l.nodeError(fmt.Errorf("revoke the session: %w", rerr))
		}
		cancel()
	}
	l.wg.Wait()
	return err
}

func (l *Locker) queueDir(name string) string { return l.cfg.prefix + "q/" + name + "/" }
func (l *Locker) fenceKey(name string) string { return l.cfg.prefix + "fence/" + name }

// nodeError files a failed call to etcd as a locking.NodeError.
func (l *Locker) nodeError(err error) error {
	return &locking.NodeError{Node: fmt.Sprint(l.client.Endpoints()), Err: err}
}

// retry runs call, each attempt bounded by WithOpTimeout, again and again
// while wctx lasts and the attempt failed in a way that another attempt may
// not: it ran out of its own time, or the cluster had no leader. A request
// that went through a member whose leader was just killed is dropped by
// the cluster and would otherwise wait out the whole wait (the fault run
// 7-etcd-leader-kill: every order of the SKU in that process stalled for
// LOCK_WAIT). Only calls that may be sent twice go through it: reads, and
// writes that compare first. The loop is locking.Retry's; which failures
// are worth another attempt is etcd's own (transient).
func (l *Locker) retry(wctx context.Context, call func(ctx context.Context) error) error {
	return locking.Retry(wctx, l.cfg.opTimeout, transient, call)
}

// transient reports whether err is an attempt's own timeout or the
// cluster's leaderless moment, which the next attempt may not meet.
func transient(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, rpctypes.ErrTimeout) || errors.Is(err, rpctypes.ErrTimeoutDueToLeaderFail) ||
		errors.Is(err, rpctypes.ErrNoLeader) || errors.Is(err, rpctypes.ErrLeaderChanged) ||
		errors.Is(err, rpctypes.ErrTimeoutDueToConnectionLost) ||
		status.Code(err) == codes.Unavailable || status.Code(err) == codes.DeadlineExceeded
}
