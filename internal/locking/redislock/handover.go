package redislock

import (
	"context"
	"sync"
	"time"

	"github.com/flashsale/stock/internal/locking"
	"github.com/flashsale/stock/internal/locking/handoff"
)

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

// handOver passes a's lock to the next goroutine of this process that waits
// for the key, without letting go of it in Redis: the successor inherits
// the lock's value and its validity, and takes the next place in the
// chain's block of tokens (locking.Batch's places). It does so only for the goroutines
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
	if !current || c.queue.Waiting(ks.key) == 0 || !locking.SameEpoch(fence, a.fence) {
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

// apply takes into a what its predecessor passed on with the turn (g).
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
