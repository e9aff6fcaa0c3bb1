package redislock

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/locking"
	"github.com/flashsale/stock/internal/locking/handoff"
)

// The process side of a lock, the same for Locker and Redlock, is core:
//
//	core.go      a key's local state, and acquire: the local queue, then Redis
//	handover.go  how the turn passes on: a local hand-over, or releaseSlot
//	lease.go     the hold, its leases and the renewal watchdog
//	notify.go    the pub/sub wake-ups
//
// The Redis side is a backend: single.go (Locker), redlock*.go (Redlock).
// The fencing tokens are internal/locking's two-part tokens (token.go
// there): the counter a backend takes from Redis is the epoch.

// Client is what this package needs from one Redis server: scripts and
// pub/sub. *redis.Client implements it; tests wrap it to inject faults.
type Client interface {
	redis.Scripter
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	// Pipelined sends ResetAll's scripts many to a round trip.
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
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

// nodeName names the i-th server in NodeErrors: its address, when the
// client tells it.
func nodeName(client Client, i int) string {
	if o, ok := client.(interface{ Options() *redis.Options }); ok {
		return o.Options().Addr
	}
	return "node" + strconv.Itoa(i)
}

// core is the process side of a Locker or a Redlock: the local line of
// goroutines per key, their holds, and the pub/sub notifiers, one per
// server. be is the Redis side.
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

// attempt is one acquisition: a token, and once held, its fence and validity.
type attempt struct {
	key        string // the Redis key, prefix included
	token      string
	deadline   time.Time // end of the wait
	inbox      *inbox
	fence      int64           // the fencing token: counter<<locking.PlaceBits + place
	validUntil time.Time       // written by acquire, then only by the watchdog
	element    string          // our entry in the server's queue (single node) or in the gate's (Redlock)
	gateEntry                  // Redlock only: our standing at the key's gate (redlock_gate.go)
	pending    *sync.WaitGroup // Redlock: calls for this lock still running, shared along a chain of hand-overs
	batch      int             // local hand-overs left before the lock must go back to all
	generation int             // keyState.generation when the chain of hand-overs began
	lost       bool            // set by Release: the hold was lost, do not hand it on
}

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// acquire is the recipe Locker and Redlock share. A context that carries a
// hold of the key re-enters it. Otherwise the goroutine queues behind this
// process's others for the key; with its turn, it takes the lock its
// predecessor handed on, if any, or asks the backend for it. A lock whose
// validity ended on the way, or whose token an AdvanceFence has passed,
// goes back to Redis and is taken again, within the wait.
func (c *core) acquire(ctx context.Context, name string) (*Lease, error) {
	key := c.cfg.prefix + name
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(locking.ErrNotObtained, err)
	}
	if h, ok := locking.HoldOf[*hold](ctx, c, key); ok {
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
		a.batch = min(c.queue.Waiting(key), locking.Places-1)
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
	if up := ks.fenceFloor + 1; locking.SameEpoch(up, a.fence) {
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
// The node errors are joined here, not passed to locking.NotObtained, which
// drops errors that wrap a context error: the NodeError of a node that hung
// until its node timeout is one, and it belongs in the answer.
func (c *core) notObtained(wctx context.Context, errs ...error) error {
	return errors.Join(append([]error{locking.NotObtained(wctx, c.closeCtx)}, errs...)...)
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
