// Package etcdlock is a lock on etcd v3 with a fencing token, for
// STRATEGY=etcd-lock.
//
// # The recipe
//
// One session per process: an etcd lease that the Locker keeps alive. To
// take a name, a process creates a key of its own under the name's queue
// prefix, attached to the session's lease; etcd gives every key a create
// revision from one global counter, so the keys queue in creation order.
// The key with the lowest create revision holds the lock; every other
// waits for the deletion of the key just before its own (its predecessor
// only: a release wakes one waiter, not the herd). A release deletes the
// key; a crashed process's keys go when its lease expires, one TTL after
// its last renewal.
//
// Inside one process, goroutines queue locally first (internal/locking/
// handoff): only one of them at a time has a key in etcd, and a release
// passes the lock to the next local waiter without a trip through etcd's
// queue, as long as the hold's budget lasts: the number of local waiters
// there were when the lock was taken from etcd. Then the lock goes back to
// the end of etcd's queue, behind the other processes.
//
// # The fencing token
//
// A token has two parts: base + R<<16 + i. R is the etcd revision at which
// it was established that a batch's first holder holds (the read that
// found no predecessor, or the write that took the key back for a new
// batch), base is the value of the name's fence key read at that same
// revision (AdvanceFence raises it; it only grows), and i is the holder's
// place in its batch: 0 for the first, and each local hand-over gives the
// next holder the next place without a request to etcd.
//
// Tokens grow strictly in hold order. Inside a batch, i grows. The next
// batch's R' is above every revision of the batch before it: a holder of
// another process reads its queue position after the batch's key was
// deleted, and a new batch in this process writes its key again, each a
// revision above everything the batch before did, so R'<<16 is above
// R<<16 + i for every place i < 1<<16 (a batch that would pass 65,536
// holders begins a new one). Taking the create revision instead would
// break fencing with local hand-overs: process P holds with create
// revision 10, process Q queues at 11, P hands over locally; if P's second
// holder kept 10 it could not be told from P's first, and if it took a
// later write's revision (say 12) Q would hold next with 11, below it.
//
// A place is handed on only while the key is still this process's (its
// watch has not seen it go, its session lives) and within a third of the
// TTL of the request that established the batch's revision, as a renewal
// would be; past that the next holder writes the key again (which fails
// if it is gone) and begins a new batch. AdvanceFence(atLeast) makes every
// later batch's tokens greater than atLeast, and this process hands on no
// place at or below it (another process may hand on a place of a batch it
// began before: the store refuses it, and that process advances the fence
// in turn).
//
// # Known problems of etcd's own recipe (concurrency.Mutex) this avoids
//
//   - Its cleanup Unlock runs without a deadline: killing a three-member
//     cluster's leader stalled waiters 5–8 s past their contexts. Every
//     cleanup here runs under WithOpTimeout; a key whose deletion failed is
//     deleted later by a goroutine the Locker owns.
//   - A waiter does not notice that its own session expired and waits
//     forever behind a key that is gone. Here a wait ends when the session
//     is lost, and the waiter queues again on a new session.
//   - A retried stale Unlock can delete a newer lock of the same session
//     (its key is the session's lease id). Here every acquisition has a key
//     of its own, and a deletion applies only if the key still has the
//     create revision its holder saw.
//   - Its waiters watch from a revision already past, which etcd serves
//     from its catching-up loop every 100 ms: a contended hand-over costs
//     about 100 ms. Here a waiter's watch starts at the revision current
//     when it is registered, which etcd serves as the deletion happens, and
//     a read once it is in place catches a deletion that came before.
//
// # Loss
//
// A lease's context ends, with a cause wrapping locking.ErrLockLost, when
// the session's lease can no longer be trusted: a renewal failed, or its
// validity (the time before the renewal was sent plus the TTL etcd
// granted, less 1% for clock drift) ran out before a renewal came back.
// The protected write must still carry the token: a holder can pause past
// its lease's end without running any code.
package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
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

	parked func(predecessor string) // tests: a waiter's watch is in place and its predecessor key still there

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

// A token is base + R<<batchBits + i: the fence base, the revision R that
// established the batch's hold, and i, the holder's place in the batch
// (see the package documentation).
const (
	batchBits = 16
	maxBatch  = 1 << batchBits // holders per batch at most
)

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
// writes that compare first.
func (l *Locker) retry(wctx context.Context, call func(ctx context.Context) error) error {
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(wctx, l.cfg.opTimeout)
		err := call(ctx)
		cancel()
		if err == nil || wctx.Err() != nil || !transient(err) {
			return err
		}
		// A cluster that refuses at once (no member up) must not be asked
		// in a busy loop: a short pause, growing to 100 ms.
		pause := time.NewTimer(min(time.Duration(attempt+1)*10*time.Millisecond, 100*time.Millisecond))
		select {
		case <-pause.C:
		case <-wctx.Done():
			pause.Stop()
			return err
		}
	}
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

// session is one etcd lease kept alive by its own loop: ctx ends (cause
// wrapping locking.ErrLockLost) when the lease can no longer be trusted.
type session struct {
	id     clientv3.LeaseID
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   chan struct{} // closed to end the renewals (Close)
	ended  chan struct{} // closed when the renewal loop has returned
}

// session returns the current session, granting a new lease when there is
// none.
func (l *Locker) session(ctx context.Context) (*session, error) {
	current := func() (*session, error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.closed {
			return nil, locking.ErrClosed
		}
		if l.sess != nil && l.sess.ctx.Err() == nil {
			return l.sess, nil
		}
		return nil, nil
	}
	if s, err := current(); s != nil || err != nil {
		return s, err
	}
	select {
	case l.grant <- struct{}{}:
		defer func() { <-l.grant }()
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	if s, err := current(); s != nil || err != nil {
		return s, err
	}
	sent := time.Now()
	resp, err := l.client.Grant(ctx, l.cfg.ttlSeconds())
	if err != nil {
		return nil, l.nodeError(fmt.Errorf("grant a lease: %w", err))
	}
	s := &session{id: resp.ID, stop: make(chan struct{}), ended: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		s.cancel(locking.ErrClosed)
		rctx, cancel := context.WithTimeout(context.Background(), l.cfg.opTimeout)
		_, _ = l.client.Revoke(rctx, s.id)
		cancel()
		return nil, locking.ErrClosed
	}
	l.sess = s
	l.wg.Add(1)
	go l.keepAlive(s, sent.Add(validity(resp.TTL)))
	return s, nil
}

// validity is how long a lease granted or renewed with ttl seconds can be
// trusted from the moment the request was sent: etcd counts the TTL from
// when it received it, later; 1% is left for the clocks' drift.
func validity(ttl int64) time.Duration {
	d := time.Duration(ttl) * time.Second
	return d - d/100
}

// loseSession ends s: every lease on it ends with a cause wrapping
// locking.ErrLockLost, the next acquisition grants a new lease, and s's
// lease is revoked in the background, so that its keys leave the queues at
// once rather than when etcd expires it (a renewal can fail while the lease
// still lives there).
func (l *Locker) loseSession(s *session, cause error) {
	if s.ctx.Err() != nil {
		return
	}
	s.cancel(fmt.Errorf("%w: etcd lease %x: %w", locking.ErrLockLost, s.id, cause))
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sess == s {
		l.sess = nil
	}
	if l.closed {
		return // Close revokes what it finds
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.opTimeout)
		defer cancel()
		_, _ = l.client.Revoke(ctx, s.id)
	}()
}

// keepAlive renews s's lease every third of the TTL until Close. The
// validity is watched by a timer of its own, not by this loop: a renewal
// or an observer that blocks cannot keep a lease alive past its validity.
func (l *Locker) keepAlive(s *session, validUntil time.Time) {
	defer l.wg.Done()
	defer close(s.ended)
	expiry := time.AfterFunc(time.Until(validUntil), func() {
		l.loseSession(s, errors.New("validity ended before a renewal came back"))
	})
	defer expiry.Stop()
	every := l.cfg.ttl / 3
	tick := time.NewTimer(every)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-s.ctx.Done():
			return
		case <-tick.C:
		}
		sent := time.Now()
		ctx, cancel := context.WithDeadline(s.ctx, validUntil)
		resp, err := l.client.KeepAliveOnce(ctx, s.id)
		cancel()
		if err == nil && resp.TTL <= 0 {
			err = errors.New("the lease has expired")
		}
		if err != nil {
			select {
			case <-s.stop:
				return
			default:
			}
			// The work stops before the observer hears of the failure.
			l.loseSession(s, fmt.Errorf("renewal failed: %w", err))
			if l.cfg.onRenew != nil {
				l.cfg.onRenew(err)
			}
			return
		}
		if !expiry.Stop() {
			return // the validity ended while the renewal was on its way: lost
		}
		validUntil = sent.Add(validity(resp.TTL))
		expiry.Reset(time.Until(validUntil))
		if l.cfg.onRenew != nil {
			l.cfg.onRenew(nil)
		}
		tick.Reset(every)
	}
}

// hold is one possession of a lock by this process, shared by the
// reentrant leases of one holder and passed from holder to holder inside
// the process.
type hold struct {
	name      string
	key       string // this process's key in the name's queue
	createRev int64
	sess      *session
	token     int64
	budget    int // local hand-overs left before the lock goes back to etcd
	// The batch's last token (its base, revision and place maxBatch-1),
	// and when the read or write that established its revision was sent.
	topToken  int64
	confirmed time.Time
	// keyCtx ends when the key is known gone (its session ended, or
	// someone else deleted it: Reset) with a cause wrapping
	// locking.ErrLockLost; stopWatch ends the watch on it once the key's
	// holders are done with it. Both go with the key from holder to
	// holder inside the process.
	keyCtx    context.Context
	keyCancel context.CancelCauseFunc
	stopWatch context.CancelFunc

	mu    sync.Mutex
	count int // leases not yet released
}

// handOn returns the hold to pass to the next holder in the process: the
// same key, a hold of its own, so that a context left over from this
// holder's leases can never re-enter the next holder's.
func (h *hold) handOn() *hold {
	return &hold{name: h.name, key: h.key, createRev: h.createRev, sess: h.sess, budget: h.budget,
		token: h.token, topToken: h.topToken, confirmed: h.confirmed,
		keyCtx: h.keyCtx, keyCancel: h.keyCancel, stopWatch: h.stopWatch}
}

// holdKey marks a lease's context with its hold, for reentrancy.
type holdKey struct {
	l    *Locker
	name string
}

// Lease is one holder's claim on a lock. Release it when done.
type Lease struct {
	l        *Locker
	h        *hold
	ctx      context.Context
	cancel   context.CancelCauseFunc
	stopLoss func() bool
	released atomic.Bool
}

// LocalWaiting reports how many goroutines of this process wait behind
// name's local holder.
func (l *Locker) LocalWaiting(name string) int { return l.queue.Waiting(name) }

// Token is the fencing token: it grows strictly with every new holder of
// the name, across processes (see the package documentation).
func (le *Lease) Token() int64 { return le.h.token }

// Context derives from the one given to Acquire; it ends with a cause
// wrapping locking.ErrLockLost when the lock is lost, and when the lease is
// released. Pass it to Acquire to take the same name again (reentrancy).
func (le *Lease) Context() context.Context { return le.ctx }

func (l *Locker) newLease(ctx context.Context, h *hold) *Lease {
	lctx, cancel := context.WithCancelCause(context.WithValue(ctx, holdKey{l, h.name}, h))
	stop := context.AfterFunc(h.keyCtx, func() { cancel(context.Cause(h.keyCtx)) })
	return &Lease{l: l, h: h, ctx: lctx, cancel: cancel, stopLoss: stop}
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
	if h, ok := ctx.Value(holdKey{l, name}).(*hold); ok {
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

// acquire is Acquire's wait and hold, within a use of name.
func (l *Locker) acquire(ctx context.Context, name string) (*Lease, error) {
	wctx, cancel := l.waitContext(ctx)
	defer cancel()
	turn, err := l.queue.Wait(wctx, name, func(t handoff.Turn[*hold]) { l.endTurn(t.Hold, name) })
	if err != nil {
		return nil, l.notObtained(wctx, nil)
	}
	h := turn.Hold
	if turn.Handed {
		if err := l.takeOver(wctx, h); err != nil {
			if wctx.Err() != nil {
				// We gave up while taking over: the key is still good for
				// the next waiter of this process.
				l.endTurn(h, name)
				return nil, l.notObtained(wctx, err)
			}
			// The key went (with its session, or deleted): take the
			// lock anew.
			l.deleteKey(h)
			h = nil
		}
	}
	if h == nil {
		if h, err = l.acquireRemote(wctx, name); err != nil {
			l.queue.Done(name)
			return nil, l.notObtained(wctx, err)
		}
		h.budget = l.queue.Waiting(name)
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

func (l *Locker) reenter(ctx context.Context, h *hold) *Lease {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.count == 0 || h.keyCtx.Err() != nil {
		return nil
	}
	h.count++
	return l.newLease(ctx, h)
}

// waitContext bounds a wait: WithWait, else the caller's deadline, else
// twice the TTL. Close ends it too.
func (l *Locker) waitContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return locking.WaitContext(ctx, l.cfg.wait, 2*l.cfg.ttl, l.closeCtx)
}

// notObtained is the error of a wait that ended without the lock.
func (l *Locker) notObtained(wctx context.Context, err error) error {
	all := []error{locking.ErrNotObtained}
	if cause := context.Cause(wctx); cause != nil {
		all = append(all, wctx.Err())
		if cause != wctx.Err() {
			all = append(all, cause)
		}
	}
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		all = append(all, err)
	}
	return errors.Join(all...)
}

// acquireRemote queues a new key for name in etcd and waits until it is
// the oldest. A session lost during the wait is replaced and the wait goes
// on; a failed call to etcd or the end of wctx ends it.
func (l *Locker) acquireRemote(wctx context.Context, name string) (*hold, error) {
	for {
		s, err := l.session(wctx)
		if err != nil {
			return nil, err
		}
		h, err := l.queueAndWait(wctx, s, name)
		if err == nil {
			return h, nil
		}
		if wctx.Err() != nil || s.ctx.Err() == nil {
			return nil, err
		}
		// The session ended while we waited: queue again on a new one.
	}
}

func (l *Locker) queueAndWait(wctx context.Context, s *session, name string) (*hold, error) {
	dir := l.queueDir(name)
	key := dir + strconv.FormatInt(int64(s.id), 16) + "-" + strconv.FormatInt(l.seq.Add(1), 10)
	h := &hold{name: name, key: key, sess: s}
	// The key is unique to this attempt, so the create can be sent again
	// or cleaned up without touching anybody else's.
	var resp *clientv3.TxnResponse
	err := l.retry(wctx, func(ctx context.Context) (err error) {
		resp, err = l.client.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, "", clientv3.WithLease(s.id))).
			Else(clientv3.OpGet(key)).
			Commit()
		return err
	})
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// The session's lease is gone in etcd (revoked, or expired while
		// the renewals were held up) before the renewal loop noticed: end
		// the session here, and the caller queues again on a new one.
		l.loseSession(s, err)
		return nil, context.Cause(s.ctx)
	}
	if err != nil {
		l.deleteKey(h) // the create may have landed
		return nil, l.nodeError(fmt.Errorf("queue %s: %w", key, err))
	}
	h.createRev = resp.Header.Revision
	if !resp.Succeeded {
		h.createRev = resp.Responses[0].GetResponseRange().Kvs[0].CreateRevision
	}
	for {
		// One transaction, so everything is read at one revision: the
		// predecessor, the fence base, and whether our key still exists.
		sent := time.Now()
		var resp *clientv3.TxnResponse
		err := l.retry(wctx, func(ctx context.Context) (err error) {
			resp, err = l.client.Txn(ctx).Then(
				clientv3.OpGet(dir, clientv3.WithPrefix(), clientv3.WithMaxCreateRev(h.createRev-1),
					clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(1), clientv3.WithKeysOnly()),
				clientv3.OpGet(l.fenceKey(name)),
				clientv3.OpGet(key, clientv3.WithKeysOnly()),
			).Commit()
			return err
		})
		if err != nil {
			l.deleteKey(h)
			return nil, l.nodeError(fmt.Errorf("read the queue of %s: %w", name, err))
		}
		rev := resp.Header.Revision
		pred := resp.Responses[0].GetResponseRange().Kvs
		if len(resp.Responses[2].GetResponseRange().Kvs) == 0 {
			// Our key is gone: the session expired, or Reset cleared
			// the queue. Queue again.
			if s.ctx.Err() != nil {
				return nil, context.Cause(s.ctx)
			}
			return l.queueAndWait(wctx, s, name)
		}
		if len(pred) == 0 {
			base, err := fenceBase(resp.Responses[1].GetResponseRange().Kvs)
			if err != nil {
				l.deleteKey(h)
				return nil, err
			}
			if err := h.beginBatch(base, rev, sent); err != nil {
				l.deleteKey(h)
				return nil, err
			}
			l.watchOwn(h)
			return h, nil
		}
		err = l.waitDeleted(wctx, s, string(pred[0].Key), pred[0].CreateRevision, rev)
		switch {
		case err == nil:
		case wctx.Err() == nil && s.ctx.Err() == nil && transient(err):
			// The watch ended with the member's leader (a leader was
			// killed): read the queue again, which waits for a new one.
		default:
			l.deleteKey(h)
			return nil, err
		}
	}
}

// watchOwn starts the watch of a new holder's key: its deletion by anyone
// but its holders ends the leases on it. Like a waiter's, the watch starts
// at the revision current when etcd registers it (a watch from a past
// revision is served by etcd's 100 ms catch-up loop, and holds up the
// creation of the client's next watch on the same stream: the waiters'),
// and a read once it is in place catches a deletion that came before.
func (l *Locker) watchOwn(h *hold) {
	h.keyCtx, h.keyCancel = context.WithCancelCause(h.sess.ctx)
	ctx, cancel := context.WithCancel(h.keyCtx)
	h.stopWatch = cancel
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer cancel()
		stopClose := context.AfterFunc(l.closeCtx, cancel)
		defer stopClose()
		gone := func(why string) {
			h.keyCancel(fmt.Errorf("%w: %s was deleted while held (%s)", locking.ErrLockLost, h.key, why))
		}
		for ctx.Err() == nil {
			for resp := range l.client.Watch(ctx, h.key, clientv3.WithCreatedNotify()) {
				if resp.Created {
					got, err := l.client.Get(ctx, h.key, clientv3.WithKeysOnly())
					if err == nil && (len(got.Kvs) == 0 || got.Kvs[0].CreateRevision != h.createRev) {
						gone("seen missing")
						return
					}
					continue
				}
				for _, ev := range resp.Events {
					if ev.Type == clientv3.EventTypeDelete {
						gone(fmt.Sprintf("revision %d", ev.Kv.ModRevision))
						return
					}
				}
			}
		}
	}()
}

// waitDeleted waits until the predecessor's key (created at createRev) is
// deleted; rev is the revision at which it was last seen. The watch starts
// at the revision current when etcd registers it, which etcd serves as
// writes happen: a watch from a given past revision (etcd's recipe watches
// from its read's) is served by etcd's catching-up loop, every 100 ms, as
// soon as any other write lands in between, and under contention one
// always does. A deletion before the registration is caught by reading the
// key again once the watch is in place.
func (l *Locker) waitDeleted(wctx context.Context, s *session, key string, createRev, rev int64) error {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(wctx))
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	for resp := range l.client.Watch(ctx, key, clientv3.WithCreatedNotify()) {
		if err := resp.Err(); err != nil {
			return l.nodeError(fmt.Errorf("watch %s: %w", key, err))
		}
		if resp.Created {
			if resp.Header.Revision != rev { // something was written since the key was seen
				got, err := l.client.Get(ctx, key, clientv3.WithKeysOnly())
				if err != nil {
					break
				}
				if len(got.Kvs) == 0 || got.Kvs[0].CreateRevision != createRev {
					return nil
				}
			}
			if l.parked != nil {
				l.parked(key)
			}
			continue
		}
		for _, ev := range resp.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return nil
			}
		}
	}
	switch {
	case s.ctx.Err() != nil:
		return context.Cause(s.ctx)
	case wctx.Err() != nil:
		return context.Cause(wctx)
	}
	return l.nodeError(fmt.Errorf("watch %s: closed", key))
}

func fenceBase(kvs []*mvccpb.KeyValue) (int64, error) {
	if len(kvs) == 0 {
		return 0, nil
	}
	base, err := strconv.ParseInt(string(kvs[0].Value), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("fence base %q: %w", kvs[0].Key, err)
	}
	return base, nil
}

// takeOver makes a hold handed over inside the process its new holder's:
// the next place of the batch, or, when none can be trusted, a new batch:
// it writes the key again (only if it is still the hold's) and takes that
// write's revision for the token, which orders the new holder after every
// earlier one.
func (l *Locker) takeOver(ctx context.Context, h *hold) error {
	if err := h.keyCtx.Err(); err != nil {
		return context.Cause(h.keyCtx)
	}
	if next := h.token + 1; next <= h.topToken && next > l.floor(h.name) && time.Since(h.confirmed) < l.cfg.ttl/3 {
		// The next place of the batch: no write (package documentation).
		h.token = next
		h.budget--
		return nil
	}
	sent := time.Now()
	var resp *clientv3.TxnResponse
	err := l.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = l.client.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.createRev)).
			Then(clientv3.OpPut(h.key, "", clientv3.WithLease(h.sess.id)), clientv3.OpGet(l.fenceKey(h.name))).
			Commit()
		return err
	})
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		l.loseSession(h.sess, err)
		return context.Cause(h.sess.ctx)
	}
	if err != nil {
		return l.nodeError(fmt.Errorf("take over %s: %w", h.key, err))
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: %s is gone", locking.ErrLockLost, h.key)
	}
	base, err := fenceBase(resp.Responses[1].GetResponseRange().Kvs)
	if err != nil {
		return err
	}
	if err := h.beginBatch(base, resp.Header.Revision, sent); err != nil {
		return err
	}
	h.budget--
	return nil
}

// beginBatch makes h the first holder of a batch established at revision
// rev (read or written by a request sent at sent), over the fence base.
func (h *hold) beginBatch(base, rev int64, sent time.Time) error {
	if rev >= 1<<(62-batchBits) || base > math.MaxInt64-rev<<batchBits-maxBatch {
		return fmt.Errorf("etcdlock: fence base %d and revision %d too large to make tokens of", base, rev)
	}
	h.token = base + rev<<batchBits
	h.topToken = h.token + maxBatch - 1
	h.confirmed = sent
	return nil
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

// deleteNow deletes h's key if it is still h's, within WithOpTimeout; a
// deletion that fails is retried in the background. It reports
// locking.ErrLockLost when the key was no longer h's.
func (l *Locker) deleteNow(ctx context.Context, h *hold) error {
	// Last, the key's context: it hangs on the session's for as long as
	// it is not ended, and a session lives for many keys (every key ever
	// held stayed a child of it with what it holds: after 100,000 SKUs
	// sold once each, the service's Go heap held 54 MB instead of 8 MB).
	if h.keyCancel != nil {
		defer h.keyCancel(errKeyDeleted)
	}
	if h.stopWatch != nil {
		defer h.stopWatch()
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.opTimeout)
	defer cancel()
	ok, err := l.deleteOwn(dctx, h)
	if err != nil {
		l.deleteKey(h)
		return l.nodeError(fmt.Errorf("release %s: %w", h.key, err))
	}
	if !ok {
		return fmt.Errorf("%w: %s was no longer this holder's", locking.ErrLockLost, h.key)
	}
	return nil
}

// errKeyDeleted ends a key's context once its holders gave it back.
var errKeyDeleted = errors.New("etcdlock: the key was given back")

func (l *Locker) deleteOwn(ctx context.Context, h *hold) (bool, error) {
	resp, err := l.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.createRev)).
		Then(clientv3.OpDelete(h.key)).
		Commit()
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// deleteKey deletes h's key in the background, retrying until it is gone
// or the Locker closes (Close revokes the session, which deletes its
// keys). A key left in the queue would hold up every later waiter until
// its lease expired, or for ever while its session lives. A lost session's
// lease is revoked (loseSession), so its keys go anyway; the retries stop
// two TTLs after that.
func (l *Locker) deleteKey(h *hold) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		var lostAt time.Time
		for {
			ctx, cancel := context.WithTimeout(context.Background(), l.cfg.opTimeout)
			// A key created without our create revision known (its answer
			// was lost) is ours by name: delete it outright.
			var err error
			if h.createRev == 0 {
				_, err = l.client.Delete(ctx, h.key)
			} else {
				_, err = l.deleteOwn(ctx, h)
			}
			cancel()
			if err == nil {
				return
			}
			if h.sess.ctx.Err() != nil {
				if lostAt.IsZero() {
					lostAt = time.Now()
				} else if time.Since(lostAt) > 2*l.cfg.ttl {
					return // its lease has expired in etcd by now
				}
			}
			retry := time.NewTimer(100 * time.Millisecond)
			select {
			case <-retry.C:
			case <-l.closeCtx.Done():
				retry.Stop()
				return
			}
		}
	}()
}

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

// AdvanceFence makes every later token of name greater than atLeast, for a
// resource that has seen a token from an etcd whose data was lost (its
// revisions began again): it raises the fence base, and this process
// hands on no place of a batch at or below it.
func (l *Locker) AdvanceFence(ctx context.Context, name string, atLeast int64) error {
	if atLeast > math.MaxInt64-2*maxBatch {
		return fmt.Errorf("etcdlock: fence %d too high: no token is above it", atLeast)
	}
	// This process hands on no place of an earlier batch at or below it.
	l.use(name)
	defer l.done(name)
	l.mu.Lock()
	ns := l.names[name]
	ns.floor = max(ns.floor, atLeast)
	l.mu.Unlock()
	key := l.fenceKey(name)
	for {
		resp, err := l.client.Get(ctx, key)
		if err != nil {
			return l.nodeError(fmt.Errorf("read the fence of %s: %w", name, err))
		}
		base, err := fenceBase(resp.Kvs)
		if err != nil {
			return err
		}
		// Every later batch's token is base' + R'<<batchBits with base'
		// >= base and R' at least this read's revision (a reader's R' may
		// equal it). The base is raised only as far as that needs:
		// raising it to atLeast itself would add a revision's worth of
		// tokens at every call, and tokens would run out.
		rev := resp.Header.Revision
		if rev >= 1<<(62-batchBits) {
			return fmt.Errorf("etcdlock: revision %d too large to make tokens of", rev)
		}
		need := atLeast - rev<<batchBits + 1
		if base >= need {
			return nil
		}
		var modRev int64
		if len(resp.Kvs) > 0 {
			modRev = resp.Kvs[0].ModRevision
		}
		put, err := l.client.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", modRev)).
			Then(clientv3.OpPut(key, strconv.FormatInt(need, 10))).
			Commit()
		if err != nil {
			return l.nodeError(fmt.Errorf("advance the fence of %s: %w", name, err))
		}
		if put.Succeeded {
			return nil
		}
	}
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
