package redislock

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/locking"
	"github.com/flashsale/stock/internal/locking/handoff"
)

// Client is what this package needs from one Redis server: scripts and
// pub/sub. *redis.Client implements it; tests wrap it to inject faults.
type Client interface {
	redis.Scripter
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

var _ Client = (*redis.Client)(nil)

// backend is the Redis side of a lock: one server (single) or a quorum of
// them (quorum). The process side (local queue, leases, watchdog) is core.
type backend interface {
	// acquire obtains the lock for a, which owns the key's local slot, and
	// fills in a.fence and a.validUntil; g says what a's predecessor in this
	// process already did for it. It returns when ctx ends at the latest.
	acquire(ctx context.Context, ks *keyState, a *attempt, g slotGrant) error
	// extend renews a's lock and returns its new validity. The error of a
	// lock found gone wraps locking.ErrLockLost.
	extend(ctx context.Context, a *attempt) (time.Time, error)
	// leave gives up a's claim, a held lock or a place in the server's
	// queue, and, with next non-nil, may pass the lock or a place in the
	// queue to next (the returned slotGrant). The error says whether a's
	// lock was still held (nil) or lost (locking.ErrLockLost). ctx is not cancelled.
	leave(ctx context.Context, a *attempt, next *attempt) (slotGrant, error)
	reset(ctx context.Context, key string) error
	// drain joins calls still running in the background.
	drain()
	// channel names the pub/sub channel this process listens on for key.
	channel(key string) string
}

// attempt is one acquisition: a token, and once held, its fence and validity.
type attempt struct {
	key        string // the Redis key, prefix included
	token      string
	deadline   time.Time // end of the wait
	inbox      *inbox
	fence      int64           // the fencing token: counter<<placeBits + place (token.go)
	validUntil time.Time       // written by acquire, then only by the watchdog
	element    string          // our entry in the server's queue (single node) or in the gate's (Redlock)
	queueID    string          // Redlock: our name in the gate's queue; token changes after a failed round, this does not
	gate       int             // Redlock: the node that served as the gate at our last look (quorum.gateFor)
	gates      []int           // Redlock: every node a gate call with token went to, answered or not (leaveGateQueue retires token there)
	pending    *sync.WaitGroup // Redlock: calls for this lock still running, shared along a chain of hand-overs
	batch      int             // local hand-overs left before the lock must go back to all
	generation int             // keyState.generation when the chain of hand-overs began
	lost       bool            // set by Release: the hold was lost, do not hand it on
}

// grantKind says how the key's local slot reached the next goroutine.
type grantKind uint8

const (
	// The zero value: the goroutine takes the lock from Redis like a
	// newcomer.
	_ grantKind = iota
	// grantHandedOn: the predecessor passed its lock on inside this process,
	// without Redis (core.handOver); the slot carries the lock's value.
	grantHandedOn
	// grantGiven: Locker only. The predecessor's release script gave the
	// lock to this goroutine in Redis.
	grantGiven
	// grantQueued: Locker only. The predecessor's release script put this
	// goroutine in the server's queue (element).
	grantQueued
	// grantReleased: Redlock only. The predecessor released the lock to
	// everyone; the goroutine listens for the announcement before it tries,
	// like the other processes' waiters.
	grantReleased
)

// slotGrant is what the releasing holder passes to the next local waiter.
type slotGrant struct {
	kind       grantKind
	fence      int64     // handedOn, given: the new holder's token
	validUntil time.Time // handedOn, given
	chain      chainLock // handedOn: the lock in Redis that the batch shares
	generation int       // given: keyState.generation before the release that gave it
	element    string    // queued: our place in the server's queue
	notBefore  time.Time // queued: the lock cannot have reached us before this
	// armed (queued, released): our inbox listened on confirmed
	// subscriptions before the predecessor's release could wake us; else
	// we look at once rather than wait for a message that may not come.
	armed bool
}

// chainLock is what a chain of local hand-overs shares: the lock's value in
// Redis, the calls for that value still running, the hand-overs left, and
// the keyState.generation the chain began in.
type chainLock struct {
	token      string
	pending    *sync.WaitGroup
	batch      int
	generation int
}

// keyState is the process-local state of one key, guarded by core.mu. The
// order in which this process's goroutines take the key is core.queue's.
type keyState struct {
	key string
	// users counts the attempts of this process that take part in the key
	// (the one whose turn it is, the ones queued behind it): the keyState
	// and its subscriptions are dropped when it falls to 0.
	users int
	hold  *hold // the hold of the attempt whose turn it is, once it has the lock
	// fenceFloor: tokens handed over must exceed it (AdvanceFence).
	fenceFloor int64
	// generation counts Resets: a chain of hand-overs begun before one
	// stops.
	generation int
	subs       []*subscription // one per server, while someone waits
}

type core struct {
	cfg       config
	be        backend
	notifiers []*notifier
	closeCtx  context.Context
	closeAll  context.CancelFunc
	renewHook atomic.Pointer[func(ctx context.Context, key string) error]
	waitHook  atomic.Pointer[func(key string)]
	grantHook atomic.Pointer[func(key string)]

	// queue orders this process's goroutines per key: one at a time talks
	// to Redis for the key, and it passes the turn on (core.releaseSlot)
	// with what the next one needs (slotGrant).
	queue *handoff.Queue[slotGrant]

	mu     sync.Mutex
	keys   map[string]*keyState
	holds  map[*hold]struct{}
	closed bool
}

func newCore(cfg config, be backend, notifiers []*notifier) *core {
	ctx, cancel := context.WithCancel(context.Background())
	return &core{
		cfg:       cfg,
		be:        be,
		notifiers: notifiers,
		closeCtx:  ctx,
		closeAll:  cancel,
		queue:     handoff.New[slotGrant](),
		keys:      make(map[string]*keyState),
		holds:     make(map[*hold]struct{}),
	}
}

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// holdKey marks a lease's context with the hold, for reentrancy.
type holdKey struct {
	c   *core
	key string
}

func (c *core) acquire(ctx context.Context, name string) (*Lease, error) {
	key := c.cfg.prefix + name
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(locking.ErrNotObtained, err)
	}
	if h, ok := ctx.Value(holdKey{c, key}).(*hold); ok {
		if l := c.reenter(ctx, h); l != nil {
			return l, nil
		}
	}
	wctx, cancel := c.waitContext(ctx)
	defer cancel()
	deadline, _ := wctx.Deadline()
	a := &attempt{key: key, token: newToken(), deadline: deadline, inbox: newInbox(), pending: new(sync.WaitGroup)}

	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, locking.ErrClosed
	}
	ks := c.keys[key]
	if ks == nil {
		ks = &keyState{key: key}
		c.keys[key] = ks
	}
	if ks.users > 0 {
		// Another goroutine of this process has the key's turn: we will
		// most likely wait, and a waiter must listen before its predecessor
		// can queue it in Redis (releaseSlot arms it).
		c.watchLocked(ks)
	}
	ks.users++
	c.mu.Unlock()
	// Only one goroutine per process and key talks to Redis; the others
	// queue behind it, first come, first served.
	gaveBack := false
	turn, err := c.queue.WaitAs(wctx, key, a, func(t handoff.Turn[slotGrant]) {
		// The turn reached us as we gave up: pass it on.
		gaveBack = true
		a.apply(t.Hold)
		_ = c.releaseSlot(ctx, ks, a)
	})
	if err != nil {
		if !gaveBack {
			c.leaveKey(ks)
		}
		return nil, c.notObtained(wctx)
	}
	g := turn.Hold
	if g.kind == grantHandedOn {
		// Handed over inside this process: the lock is ours already,
		// unless its validity ended on the way (this goroutine paused
		// between the hand-over and here). Then it takes the normal path.
		a.apply(g)
		if hook := c.grantHook.Load(); hook != nil {
			(*hook)(key)
		}
		if c.aboveFloor(ks, a) {
			l, err := c.newHold(ctx, ks, a)
			if !errors.Is(err, errExpired) {
				return l, err
			}
		}
		c.abandon(ctx, a)
		g = slotGrant{}
	}
	for {
		// The chain's generation is the one before Redis was asked: a
		// Reset that lands while the call is on its way deletes the lock
		// it takes, and must end the chain it would begin. A lock the
		// predecessor's release gave us is as old as that release.
		c.mu.Lock()
		generation := ks.generation
		c.mu.Unlock()
		if g.kind == grantGiven {
			generation = g.generation
		}
		err := c.be.acquire(wctx, ks, a, g)
		// Done waiting: the subscriptions stop routing messages to a. (A
		// predecessor arms a's inbox before it passes the lock on in Redis,
		// and a backend that finds the lock already granted never waits.)
		c.disarm(ks, a.inbox)
		if err != nil {
			_ = c.releaseSlot(ctx, ks, a)
			return nil, err
		}
		// Serve the goroutines of this process that wait now, by
		// hand-over, then give the lock back to all (see handOver).
		a.generation = generation
		a.batch = min(c.queue.Waiting(key), maxPlace)
		if c.aboveFloor(ks, a) {
			l, err := c.newHold(ctx, ks, a)
			if !errors.Is(err, errExpired) {
				return l, err
			}
		}
		// The validity ended before we could hold the lock (a pause, or
		// a lock handed to us in Redis long ago), or its counter is below
		// an AdvanceFence that returned meanwhile: give it back and try
		// again, within the wait.
		c.abandon(ctx, a)
		g = slotGrant{}
	}
}

// aboveFloor makes a's token greater than the floor that AdvanceFence set
// in this process, by moving it up within a's chain's places if need be,
// and reports false when no place of the chain is above the floor: a must
// then give the lock back and take it from Redis again, under a counter
// that AdvanceFence has already raised past the floor. This check, under
// the lock that AdvanceFence raises the floor under, is the moment a lease
// is obtained: an AdvanceFence that returned before it is honoured, be the
// token handed on or read from Redis before the counter was raised.
func (c *core) aboveFloor(ks *keyState, a *attempt) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if a.fence > ks.fenceFloor {
		return true
	}
	if up := ks.fenceFloor + 1; sameChain(up, a.fence) {
		a.fence = up
		return true
	}
	return false
}

// errExpired: newHold refused a lock whose validity had already ended.
var errExpired = errors.New("locking: validity ended before the hold began")

// abandon gives back in Redis a lock whose validity ended before a held
// it, keeping a's local slot, and makes a a fresh attempt: a new value (the
// old one's late calls, if any, stay harmless), no fence, no batch.
func (c *core) abandon(ctx context.Context, a *attempt) {
	_, _ = c.be.leave(context.WithoutCancel(ctx), a, nil) // locking.ErrLockLost, most likely: it expired
	a.token, a.queueID, a.element, a.gates = newToken(), "", "", nil
	a.fence, a.validUntil = 0, time.Time{}
	a.pending, a.batch, a.generation, a.lost = new(sync.WaitGroup), 0, 0, false
}

// waitContext bounds the wait: WithWait, else the caller's deadline, else
// twice the TTL. Close ends it too.
func (c *core) waitContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return locking.WaitContext(ctx, c.cfg.wait, 2*c.cfg.ttl, c.closeCtx)
}

// notObtained is the error of a wait that ended: locking.ErrNotObtained, the
// context's error, locking.ErrClosed if Close ended it, and the last node errors.
func (c *core) notObtained(wctx context.Context, errs ...error) error {
	all := []error{locking.ErrNotObtained, wctx.Err()}
	if c.closeCtx.Err() != nil {
		all = append(all, locking.ErrClosed)
	}
	return errors.Join(append(all, errs...)...)
}

func (a *attempt) apply(g slotGrant) {
	switch g.kind {
	case grantQueued:
		a.element = g.element
	case grantGiven:
		a.fence, a.validUntil = g.fence, g.validUntil
	case grantHandedOn:
		a.fence, a.validUntil = g.fence, g.validUntil
		a.token, a.pending, a.batch, a.generation = g.chain.token, g.chain.pending, g.chain.batch, g.chain.generation
	}
}

// leaveKey ends a's part in ks (see keyState.users): the last attempt to
// leave drops the keyState and its subscriptions, so a process that locks
// many keys keeps nothing for the idle ones.
func (c *core) leaveKey(ks *keyState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ks.users--; ks.users > 0 {
		return
	}
	if c.keys[ks.key] == ks {
		delete(c.keys, ks.key)
	}
	for _, s := range ks.subs {
		s.n.unsubscribe(s)
	}
	ks.subs = nil
}

// watch subscribes the process to key's wake channel on every server, for
// as long as the keyState lives.
func (c *core) watch(ks *keyState) []*subscription {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.watchLocked(ks)
}

func (c *core) watchLocked(ks *keyState) []*subscription {
	if ks.subs == nil && !c.closed {
		for _, n := range c.notifiers {
			ks.subs = append(ks.subs, n.subscribe(c.be.channel(ks.key)))
		}
	}
	return ks.subs
}

// handOver passes a's lock to the next goroutine of this process that waits
// for the key, without letting go of it in Redis: the successor inherits
// the lock's value and its validity, and takes the next place in the
// chain's block of tokens (token.go). It does so only for the goroutines
// that waited when the process took the lock (a.batch), and then gives the
// lock back to everyone: cheap hand-overs, without starving other
// processes.
//
// Every later acquisition from Redis takes a greater counter than the one
// that began the chain, so a token above the whole block: tokens still grow
// with every new holder, and a hand-over needs no call to Redis (doc.go).
// Nothing is handed on once the validity has ended; the lock is confirmed
// in Redis (an extend, within the validity) whenever its last confirmation
// is older than a renewal interval, so a chain of short holds notices a
// lost lock as soon as one long hold would; a Reset in this process ends
// the chain, and so does an AdvanceFence that leaves no token of the block
// above what it was given.
func (c *core) handOver(ctx context.Context, ks *keyState, a *attempt) bool {
	if a.fence == 0 || a.lost || a.batch <= 0 || !time.Now().Before(a.validUntil) {
		return false
	}
	c.mu.Lock()
	current := !c.closed && a.generation == ks.generation
	fence := max(a.fence, ks.fenceFloor) + 1
	c.mu.Unlock()
	if !current || c.queue.Waiting(ks.key) == 0 || !sameChain(fence, a.fence) {
		return false
	}
	// Go back to Redis when the lock was last confirmed there more than a
	// renewal interval ago: a chain of short holds must not outlive a lock
	// lost to Reset or to a server that restarted empty for longer than
	// one hold would.
	if time.Until(a.validUntil) < c.cfg.ttl-c.cfg.drift()-c.cfg.renewInterval() {
		// Within the validity, like a renewal: Redlock's extend takes back
		// nodes that lost the key, which is safe only while we hold a
		// majority.
		ectx, cancel := context.WithDeadline(context.WithoutCancel(ctx), a.validUntil)
		until, err := c.be.extend(ectx, a)
		cancel()
		if err != nil || !time.Now().Before(until) {
			return false // the lock may be lost: leave reports it
		}
		a.validUntil = until
	}
	// a waits for nothing any more: an inbox left in the subscriptions
	// would stay there, one per batch, until the key goes idle, and be
	// scanned by every message.
	c.disarm(ks, a.inbox)
	// Pass finds nobody if the waiters gave up meanwhile: the lock then
	// goes back to Redis.
	return c.queue.Pass(ks.key, slotGrant{
		kind: grantHandedOn, fence: fence, validUntil: a.validUntil,
		// A renewal's call that a slow node answers late may still be
		// running: whoever finally releases the lock must wait for it, or
		// it could put the lock back on that node after the release.
		chain: chainLock{token: a.token, pending: a.pending, batch: a.batch - 1, generation: a.generation},
	})
}

// raiseFenceFloor makes the hand-overs of key's current chain take tokens
// above atLeast (AdvanceFence raised the counters in Redis; the places left
// in the chain's block may be below it).
func (c *core) raiseFenceFloor(key string, atLeast int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ks := c.keys[key]; ks != nil {
		ks.fenceFloor = max(ks.fenceFloor, atLeast)
	}
}

// endChain stops key's current chain of hand-overs (Reset): its lock is
// gone, and the holder learns it at its next renewal or release.
func (c *core) endChain(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ks := c.keys[key]; ks != nil {
		ks.generation++
	}
}

// releaseSlot gives up a's claim in Redis and passes the key's turn in this
// process to the next goroutine that waits for it, or ends it. It ends a's
// part in ks.
func (c *core) releaseSlot(ctx context.Context, ks *keyState, a *attempt) error {
	defer c.leaveKey(ks)
	if c.handOver(ctx, ks, a) {
		return nil
	}
	c.disarm(ks, a.inbox)
	// The next goroutine is named to Redis with the release (single node:
	// the release script gives it the lock or queues it), so it is taken
	// out of the local line first, and its inbox listens before the script
	// can send it the hand-over.
	next := c.queue.Claim(ks.key)
	var na *attempt
	armed := false
	c.mu.Lock()
	generation := ks.generation // before the release script can give next the lock
	c.mu.Unlock()
	if next != nil {
		na = next.Who().(*attempt)
		c.mu.Lock()
		armed = len(ks.subs) > 0
		for _, s := range ks.subs {
			s.arm(na.inbox)
			select {
			case <-s.readyC():
			default:
				armed = false
			}
		}
		c.mu.Unlock()
	}
	g, err := c.be.leave(context.WithoutCancel(ctx), a, na)
	if next == nil {
		// A goroutine that queued while we were in Redis takes the lock
		// from Redis itself.
		c.queue.Done(ks.key)
		return err
	}
	g.armed = g.armed && armed
	g.generation = generation
	next.Give(handoff.Turn[slotGrant]{Hold: g, Handed: true})
	return err
}

// disarm removes b from key's subscriptions.
func (c *core) disarm(ks *keyState, b *inbox) {
	for _, s := range ks.subsSnapshot(c) {
		s.disarm(b)
	}
}

func (ks *keyState) subsSnapshot(c *core) []*subscription {
	c.mu.Lock()
	defer c.mu.Unlock()
	return ks.subs
}

// hold is one holder's possession of a lock, shared by its reentrant leases.
type hold struct {
	c      *core
	ks     *keyState
	a      *attempt
	count  int   // leases not yet released; guarded by c.mu
	lost   error // why the lock was lost; guarded by c.mu
	ctx    context.Context
	cancel context.CancelCauseFunc
	expiry *time.Timer // fires when validity runs out unrenewed

	// The watchdog is a timer whose function renews the lock and re-arms
	// it, rather than a goroutine per hold that mostly sleeps: a short hold
	// then costs no goroutine start and no wake-ups to stop it.
	wmu      sync.Mutex
	idle     *sync.Cond // signalled when a renewal finishes
	renewal  *time.Timer
	running  bool               // a renewal is in progress
	stopped  bool               // no more renewals
	stopCtx  context.Context    // cancelled to cut an in-flight renewal short
	stopCall context.CancelFunc //
}

// Lease is one holder's claim on a lock. Release it when done; until then
// the watchdog renews the lock and Context is cancelled if it is lost.
type Lease struct {
	h        *hold
	ctx      context.Context
	cancel   context.CancelCauseFunc
	released atomic.Bool
}

// newHold makes a's lock a hold with a lease. It refuses (errExpired, with
// nothing changed) a lock whose validity has ended: a lease must never
// start without a lock behind it.
func (c *core) newHold(ctx context.Context, ks *keyState, a *attempt) (*Lease, error) {
	if !time.Now().Before(a.validUntil) {
		return nil, errExpired
	}
	h := &hold{c: c, ks: ks, a: a, count: 1}
	h.ctx, h.cancel = context.WithCancelCause(context.WithValue(ctx, holdKey{c, ks.key}, h))
	h.idle = sync.NewCond(&h.wmu)
	h.stopCtx, h.stopCall = context.WithCancel(context.Background())
	// The expiry timer does not depend on renewals running: if they stall,
	// the work is still stopped when validity ends. It is armed only once
	// h.expiry is set: a validity that ends within microseconds would
	// otherwise run lose, which stops h.expiry, before the assignment.
	h.expiry = time.AfterFunc(time.Hour, func() {
		h.lose(fmt.Errorf("%w: %s: validity ended before a renewal succeeded", locking.ErrLockLost, ks.key))
	})
	h.expiry.Reset(time.Until(a.validUntil))

	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		h.expiry.Stop()
		h.cancel(locking.ErrClosed)
		_ = c.releaseSlot(ctx, ks, a)
		return nil, errors.Join(locking.ErrNotObtained, locking.ErrClosed)
	}
	ks.hold = h
	c.holds[h] = struct{}{}
	c.mu.Unlock()

	h.wmu.Lock()
	h.renewal = time.AfterFunc(h.nextRenewal(), h.renew)
	h.wmu.Unlock()
	lctx, cancel := context.WithCancelCause(h.ctx)
	return &Lease{h: h, ctx: lctx, cancel: cancel}, nil
}

func (c *core) reenter(ctx context.Context, h *hold) *Lease {
	c.mu.Lock()
	defer c.mu.Unlock()
	if h.count == 0 || h.lost != nil {
		return nil
	}
	h.count++
	lctx, cancel := context.WithCancelCause(ctx)
	return &Lease{h: h, ctx: lctx, cancel: cancel}
}

// lose cancels the protected work with cause, which wraps locking.ErrLockLost.
func (h *hold) lose(cause error) {
	h.c.mu.Lock()
	if h.lost == nil {
		h.lost = cause
	}
	h.c.mu.Unlock()
	h.expiry.Stop()
	h.cancel(cause)
}

// nextRenewal is the renewal interval, or half the remaining validity if
// that is shorter (a lock received with little validity left).
func (h *hold) nextRenewal() time.Duration {
	d := h.c.cfg.renewInterval()
	if half := time.Until(h.a.validUntil) / 2; half < d {
		d = max(half, 0)
	}
	return d
}

// renew is the watchdog: it renews the lock and re-arms itself. A failed
// renewal stops the work at once: the holder learns it from its context,
// never from a log line.
func (h *hold) renew() {
	h.wmu.Lock()
	if h.stopped {
		h.wmu.Unlock()
		return
	}
	h.running = true
	h.wmu.Unlock()

	ok := h.renewOnce()

	h.wmu.Lock()
	h.running = false
	if ok && !h.stopped {
		h.renewal.Reset(h.nextRenewal())
	}
	h.idle.Broadcast()
	h.wmu.Unlock()
}

func (h *hold) renewOnce() bool {
	c, a, ctx := h.c, h.a, h.stopCtx
	if hook := c.renewHook.Load(); hook != nil {
		if err := (*hook)(ctx, a.key); err != nil {
			if ctx.Err() == nil {
				h.lose(lostCause(a.key, err))
			}
			return false
		}
	}
	if !time.Now().Before(a.validUntil) {
		return false // the expiry timer has cancelled the work
	}
	rctx, cancel := context.WithDeadline(ctx, a.validUntil)
	until, err := c.be.extend(rctx, a)
	cancel()
	if ctx.Err() != nil {
		return false // released meanwhile
	}
	if err != nil {
		// The work stops before the observer hears of the failure: whoever
		// sees the failed renewal may rely on the context being cancelled.
		h.lose(lostCause(a.key, err))
	}
	if c.cfg.onRenew != nil {
		c.cfg.onRenew(a.key, err)
	}
	if err != nil {
		return false
	}
	if !h.expiry.Stop() {
		return false // validity ended while we renewed: already lost
	}
	a.validUntil = until
	h.expiry.Reset(time.Until(until))
	return true
}

// stopRenewal stops the watchdog and waits for a renewal in progress: after
// it returns, nothing touches the lock on the holder's behalf.
func (h *hold) stopRenewal() {
	h.stopCall()
	h.wmu.Lock()
	h.stopped = true
	if h.renewal != nil {
		h.renewal.Stop()
	}
	for h.running {
		h.idle.Wait()
	}
	h.wmu.Unlock()
}

func lostCause(key string, err error) error {
	if errors.Is(err, locking.ErrLockLost) {
		return err
	}
	return fmt.Errorf("%w: %s: renewal failed: %w", locking.ErrLockLost, key, err)
}

// Token returns the fencing token: it grows strictly with every new holder
// of the key (see the package documentation). Pass it to the resource the
// lock protects, which should reject tokens lower than one it has seen.
func (l *Lease) Token() int64 { return l.h.a.fence }

// Context returns a context derived from the one given to Acquire. It is
// cancelled when the lock is lost, with a cause wrapping locking.ErrLockLost
// (context.Cause), and when the lease is released. Do the protected work
// under it, and pass it to Acquire to take the same key again (reentrancy).
func (l *Lease) Context() context.Context { return l.ctx }

// Release gives the lease up. The last lease of a hold stops the watchdog,
// waits for it, and releases the lock in Redis under
// context.WithoutCancel(ctx) with the node timeout, so a cancelled request
// never strands a lock; a waiter is woken at once. It returns locking.ErrNotHeld for
// a second Release, and an error wrapping locking.ErrLockLost when the lock had been
// lost (expired, taken, or no longer confirmed by a majority): the work done
// under it was not protected to the end.
func (l *Lease) Release(ctx context.Context) error {
	if !l.released.CompareAndSwap(false, true) {
		return locking.ErrNotHeld
	}
	l.cancel(context.Canceled)
	h := l.h
	c := h.c
	c.mu.Lock()
	h.count--
	last := h.count == 0
	lost := h.lost
	c.mu.Unlock()
	if !last {
		return lost
	}
	h.stopRenewal()
	h.expiry.Stop()
	c.mu.Lock()
	lost = h.lost
	h.ks.hold = nil
	delete(c.holds, h)
	c.mu.Unlock()
	h.cancel(context.Canceled)
	h.a.lost = lost != nil
	err := c.releaseSlot(ctx, h.ks, h.a)
	if lost != nil {
		return lost
	}
	return err
}

func (c *core) setRenewHook(f func(ctx context.Context, key string) error) {
	if f == nil {
		c.renewHook.Store(nil)
		return
	}
	c.renewHook.Store(&f)
}

func (c *core) setWaitHook(f func(key string)) {
	if f == nil {
		c.waitHook.Store(nil)
		return
	}
	c.waitHook.Store(&f)
}

func (c *core) setGrantHook(f func(key string)) {
	if f == nil {
		c.grantHook.Store(nil)
		return
	}
	c.grantHook.Store(&f)
}

// waiting tells the test hook that the slot owner for key is about to block.
func (c *core) waiting(key string) {
	if hook := c.waitHook.Load(); hook != nil {
		(*hook)(key)
	}
}

func (c *core) close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	holds := make([]*hold, 0, len(c.holds))
	for h := range c.holds {
		holds = append(holds, h)
	}
	c.mu.Unlock()
	c.closeAll() // ends every wait
	for _, h := range holds {
		h.stopRenewal()
		// Renewal has stopped, so the lock will expire: stop the work now.
		h.lose(fmt.Errorf("%w: %s: %w", locking.ErrLockLost, h.ks.key, locking.ErrClosed))
	}
	c.be.drain()
	var errs []error
	for _, n := range c.notifiers {
		errs = append(errs, n.close())
	}
	return errors.Join(errs...)
}
