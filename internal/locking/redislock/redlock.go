package redislock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/backoff"
	"github.com/flashsale/stock/internal/locking"
)

// Redlock is a lock over N independent Redis servers (N odd, at least 3):
// it is held while a majority of them hold it, so it survives the loss of a
// minority. Fencing tokens stay monotonic across such losses (see the
// package documentation). Like Locker, waiters queue locally (FIFO) and are
// woken by pub/sub; split votes back off with jitter.
type Redlock struct {
	c *core
	q *quorum
}

// NewRedlock returns a Redlock over clients, one per independent server
// (not replicas of each other). It fails unless len(clients) is odd and at
// least 3: with an even count a majority buys nothing over the next lower
// odd count. Close it to stop its pub/sub listeners.
func NewRedlock(clients []*redis.Client, opts ...Option) (*Redlock, error) {
	cs := make([]Client, len(clients))
	for i, c := range clients {
		cs[i] = c
	}
	return newRedlock(cs, opts...)
}

func newRedlock(clients []Client, opts ...Option) (*Redlock, error) {
	if len(clients) < 3 || len(clients)%2 == 0 {
		return nil, fmt.Errorf("locking: Redlock needs an odd number of at least 3 servers, got %d", len(clients))
	}
	cfg := defaultConfig(50 * time.Millisecond)
	for _, o := range opts {
		o(&cfg)
	}
	q := &quorum{need: len(clients)/2 + 1, running: map[*sync.WaitGroup]int{},
		gateDown: make([]atomic.Int64, len(clients)), gateFails: make([]atomic.Int32, len(clients))}
	notifiers := make([]*notifier, len(clients))
	for i, cl := range clients {
		q.nodes = append(q.nodes, rnode{name: nodeName(cl, i), client: cl})
		q.byName = append(q.byName, i)
		notifiers[i] = newNotifier(cl)
	}
	slices.SortStableFunc(q.byName, func(i, j int) int { return strings.Compare(q.nodes[i].name, q.nodes[j].name) })
	c := newCore(cfg, q, notifiers)
	q.c, q.cfg = c, &c.cfg
	return &Redlock{c: c, q: q}, nil
}

// Acquire takes the lock named key on a majority of the servers, waiting
// while it is held (see WithWait). The fencing token is fixed on a majority
// before Acquire returns. Reentrancy works as for Locker.Acquire.
//
// A wait that ends fails with errors.Join(locking.ErrNotObtained, ctx.Err(), the
// NodeErrors of the last round...): with a majority of servers down it fails
// closed, never open.
func (r *Redlock) Acquire(ctx context.Context, key string) (*Lease, error) {
	return r.c.acquire(ctx, key)
}

// Reset deletes the lock named key on every server it can reach (best
// effort) and fails if fewer than a majority answered. Like Locker.Reset it
// frees a stuck lock and keeps the fencing counters: tokens never go back.
// A holder of the key loses it at its next renewal: Reset leaves a
// tombstone for the value it removed, so the renewal, which takes back a
// key missing on a node (restarted empty), does not take it back there.
func (r *Redlock) Reset(ctx context.Context, key string) error {
	r.c.endChain(r.c.cfg.prefix + key)
	return r.q.reset(ctx, r.c.cfg.prefix+key)
}

// ResetAll is Reset for many keys (a catalog's new sales): on each server
// the reset scripts go a thousand to a round trip, the servers at once,
// and it fails unless a majority reset them all (10,000 keys took 2.0 s
// one at a time, 32 at once).
func (r *Redlock) ResetAll(ctx context.Context, keys []string) error {
	full := make([]string, len(keys))
	for i, key := range keys {
		full[i] = r.c.cfg.prefix + key
		r.c.endChain(full[i])
	}
	return r.q.resetAll(ctx, full)
}

// AdvanceFence makes every later token of key greater than atLeast, as
// Locker.AdvanceFence does (with its exception for other processes). It raises the counter on every server it can
// reach and fails unless a majority answered: a later token is above every
// counter it read on a majority, and any majority meets the one raised here.
func (r *Redlock) AdvanceFence(ctx context.Context, key string, atLeast int64) error {
	floor, err := locking.EpochAbove(atLeast)
	if err != nil {
		return err
	}
	fence := r.c.cfg.prefix + key + ":fence"
	timeout := r.c.cfg.unhurriedTimeout()
	errs := make([]error, len(r.q.nodes))
	var wg sync.WaitGroup
	for i, n := range r.q.nodes {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			if err := advanceFence.Run(ctx, n.client, []string{fence}, floor).Err(); err != nil {
				errs[i] = &locking.NodeError{Node: n.name, Err: err}
			}
		})
	}
	wg.Wait()
	errs = compact(errs)
	if answered := len(r.q.nodes) - len(errs); answered < r.q.need {
		return errors.Join(append([]error{
			fmt.Errorf("locking: advance fence of %s: %d of %d nodes answered, %d needed", key, answered, len(r.q.nodes), r.q.need),
		}, errs...)...)
	}
	// After the counters: a chain that read its counters before the writes
	// exists in this process by now, and learns of the floor.
	r.c.raiseFenceFloor(r.c.cfg.prefix+key, atLeast)
	return nil
}

// Close ends waiting Acquires, cancels the context of leases still held,
// stops the pub/sub listeners and joins every goroutine of the Redlock. It
// does not close the clients.
func (r *Redlock) Close() error { return r.c.close() }

type rnode struct {
	name   string
	client Client
}

// quorum is Redlock's backend: the nodes, and what their calls share. Its
// files: redlock_gate.go (the gate), redlock_round.go (an acquisition
// round), redlock_quorum.go (calls to every node; renewal and release).
type quorum struct {
	c      *core
	cfg    *config
	nodes  []rnode
	byName []int          // node indexes in the order of their names
	need   int            // majority
	bg     sync.WaitGroup // release calls still running after Release returned; Close joins them

	mu       sync.Mutex
	draining bool                    // Close is joining bg: a call started now must be joined by its caller
	running  map[*sync.WaitGroup]int // calls of run still running, by the WaitGroup that counts them

	gateDown  []atomic.Int64 // by node: until when (Unix ns) it is passed over as a gate (gateFor)
	gateFails []atomic.Int32 // by node: gate calls failed in a row
}

func (q *quorum) channel(key string) string { return key + ":wake" }

// acquire is Redlock's wait for the lock, one look at a time: it asks the
// key's gate (tryGate); while someone is ahead of us there, it listens for
// that one's release; once the gate is ours, or does not answer, it runs a
// round on every node (tryAll) and settles it into a held lock (settle). A
// round that fails is undone (undoRound), and we wait for the release of
// whoever won it or, after a split vote, back off for a random while.
func (q *quorum) acquire(ctx context.Context, ks *keyState, a *attempt, g slotGrant) error {
	cfg := q.cfg
	a.queueID = a.token
	var subs []*subscription
	defer func() {
		for _, s := range subs {
			s.disarm(a.inbox)
		}
	}()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	if g.kind == grantReleased && g.armed {
		// Our predecessor gave the lock back to everyone: start when the
		// release is announced, like the other processes' waiters, not
		// before them.
		subs = q.c.watch(ks)
		t.Reset(cfg.pollInterval)
		q.wait(ctx, a, t, true)
	}
	splits := 0
	// startListening subscribes, the first time we find the lock taken,
	// and reports whether it did: the caller then looks again before it
	// waits, since a release announced before the subscription was
	// confirmed would not wake us. It waits for a majority of the servers
	// to confirm, not for all (awaitConfirmed): a server that is down or
	// hung never does, and must not keep us awake. Nor does it wait long
	// for the majority: without it we sleep on timers (polling), and a
	// confirmation that comes later wakes us to look again.
	startListening := func() bool {
		if subs != nil {
			return false
		}
		subs = q.c.watch(ks)
		for _, s := range subs {
			s.arm(a.inbox)
		}
		awaitConfirmed(ctx, a.inbox, subs, q.need, max(2*cfg.nodeTimeout, 20*time.Millisecond))
		return true
	}
	bypassGate := false
	queuedBefore := false // the last look found the gate free but someone else first
	var lastErrs []error  // the node errors of the last round, for the caller
	for {
		if ctx.Err() != nil {
			return q.c.notObtained(ctx, lastErrs...)
		}
		a.inbox.take() // what arrived before this round is stale
		gateState, pttl, counter := gateUnknown, time.Duration(0), int64(0)
		if !bypassGate {
			gateState, pttl, counter = q.tryGate(ctx, a)
		}
		bypassGate = false
		if gateState == gateQueued && queuedBefore {
			// The gate stayed free with the same kind of answer after a
			// wait: whoever is first in line is not taking it (a crashed
			// waiter keeps its place until its entry expires). Race.
			gateState = gateUnknown
		}
		queuedBefore = false
		if gateState == gateTaken || gateState == gateQueued {
			// Someone is ahead of us: a release (or a failed round's
			// undoing of the gate) wakes us, else the holder's TTL or the
			// poll interval. A free gate that someone else is first in
			// line for is looked at again soon: the first in line takes
			// it within a round trip if it is alive.
			if startListening() {
				continue
			}
			d := cfg.pollInterval
			switch gateState {
			case gateTaken:
				d = min(d, pttl+time.Millisecond)
			case gateQueued:
				d = min(d, max(2*cfg.nodeTimeout, 10*time.Millisecond))
			}
			t.Reset(d)
			q.c.waiting(a.key)
			woken := q.wait(ctx, a, t, true)
			if ctx.Err() != nil {
				return q.c.notObtained(ctx, lastErrs...)
			}
			// Nothing announced before the timer: a taken gate may be
			// held by nobody who will release it (a contender whose gate
			// call landed after it gave up leaves it for a TTL), so race
			// without it once rather than trust it.
			bypassGate = !woken && gateState == gateTaken
			queuedBefore = !woken && gateState == gateQueued
			continue
		}
		var p int64
		if gateState == gateOurs && counter < locking.MaxEpoch {
			// The gate node's counter is, nearly always, what every node
			// holds: the last holder wrote its counter everywhere. So
			// propose the next one with the round.
			p = counter + 1
		}
		start := time.Now()
		r := q.tryAll(ctx, a, p)
		lastErrs = r.errs
		if q.settle(ctx, a, &r, start) {
			q.leaveGateQueue(context.WithoutCancel(ctx), a, false)
			return nil
		}
		q.undoRound(ctx, a, &r, gateState == gateOurs)
		if ctx.Err() != nil {
			q.leaveGateQueue(context.WithoutCancel(ctx), a, false) // the new token was never sent
			return q.c.notObtained(ctx, r.errs...)
		}
		if startListening() {
			continue
		}
		var d time.Duration
		holder, n := r.top()
		listen := n >= q.need
		if listen {
			// Someone holds a majority: its release (announced on every
			// node) wakes us. Its TTL running out, or the poll interval,
			// wakes us otherwise.
			splits = 0
			d = cfg.pollInterval
			if p := r.pttl[holder]; p > 0 && p+time.Millisecond < d {
				d = p + time.Millisecond
			}
		} else {
			// A split vote, or nodes unreachable or not heard from: nobody
			// is coming to wake us. Back off for a random while, longer
			// after each split, so that contenders stop colliding.
			splits++
			d = backoff.Exponential(min(splits-1, 3), cfg.retryJitter, cfg.pollInterval) + time.Millisecond
		}
		t.Reset(d)
		q.c.waiting(a.key)
		q.wait(ctx, a, t, listen)
		if ctx.Err() != nil {
			return q.c.notObtained(ctx, r.errs...)
		}
	}
}

// wait returns when t fires, ctx ends, or (listen) a release is announced
// or we are told to poll; it reports whether a message woke it. Only
// holders of a majority (and a gate holder whose round split) announce a
// release, and a process announces nothing until its batch of hand-overs
// ends, so any announcement is worth a new look.
func (q *quorum) wait(ctx context.Context, a *attempt, t *time.Timer, listen bool) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return false
		case <-a.inbox.c:
		}
		if listen {
			return true
		}
	}
}
