package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/flashsale/stock/internal/locking"
)

// Locker is a lock over one Redis server, with a watchdog, fair waiting
// (local FIFO, then a FIFO queue on the server) and fencing tokens. It is
// safe for concurrent use; use one Locker per process and server.
type Locker struct {
	c *core
	s *single
}

// New returns a Locker over client, usually a *redis.Client. Close it to
// stop its pub/sub listener.
func New(client Client, opts ...Option) *Locker {
	cfg := defaultConfig(time.Second)
	for _, o := range opts {
		o(&cfg)
	}
	s := &single{client: client, node: nodeName(client, 0), id: newToken()}
	c := newCore(cfg, s, []*notifier{newNotifier(client)})
	s.c, s.cfg = c, &c.cfg
	return &Locker{c: c, s: s}
}

// Acquire takes the lock named key, waiting for it while it is held (see
// WithWait for how long). The lease's watchdog renews the lock until
// Release. If ctx comes from a Lease of the same key and Locker, Acquire
// re-enters it: it returns at once with another Lease of the same hold, and
// the lock is freed when every such Lease is released.
//
// A wait that ends fails with errors.Join(locking.ErrNotObtained, ctx.Err()), plus
// the last locking.NodeError if the server was failing.
func (l *Locker) Acquire(ctx context.Context, key string) (*Lease, error) {
	return l.c.acquire(ctx, key)
}

// Reset deletes the lock named key and its queue, and tells waiters to try
// again. It is an administrative "free a stuck lock": a holder of the key
// loses it at its next renewal (the removed value gets a tombstone, so not
// even a late call of the holder's puts it back). It keeps the fencing counter: tokens only
// ever grow, across Resets too, so a store that remembers the highest token
// it accepted still accepts the next holder.
func (l *Locker) Reset(ctx context.Context, key string) error {
	l.c.endChain(l.c.cfg.prefix + key)
	return l.s.reset(ctx, l.c.cfg.prefix+key)
}

// ResetAll is Reset for many keys (a catalog's new sales): the reset
// scripts go a thousand to a round trip instead of one each (10,000 keys
// took 0.46 s one at a time, 32 at once).
func (l *Locker) ResetAll(ctx context.Context, keys []string) error {
	full := make([]string, len(keys))
	for i, key := range keys {
		full[i] = l.c.cfg.prefix + key
		l.c.endChain(full[i])
	}
	if err := resetKeys(ctx, l.s.client, full, l.s.cfg.ttl, 0); err != nil {
		return l.s.nodeErr(err)
	}
	return nil
}

// AdvanceFence makes every later token of key greater than atLeast: every
// acquisition from Redis that begins after it returns, and every lease this
// Locker gives from then on, by hand-over too, save a reentrant one, which
// shares its hold's token. (Another Locker may still
// hand on places of a chain it began before; the store refuses them and
// that Locker advances the fence in turn.) A store that remembers the
// highest token it accepted calls it when it refuses a token: if Redis lost
// its data (a restart without persistence), its counter started again from
// 1, and without this every new holder would be refused until the counter
// caught up. It never lowers the counter, and it refuses, with
// locking.ErrTokensExhausted, an atLeast that no token can exceed.
func (l *Locker) AdvanceFence(ctx context.Context, key string, atLeast int64) error {
	floor, err := locking.EpochAbove(atLeast)
	if err != nil {
		return err
	}
	if err := advanceFence.Run(ctx, l.s.client, []string{l.c.cfg.prefix + key + ":fence"}, floor).Err(); err != nil {
		return l.s.nodeErr(err)
	}
	// After the counter: a chain that took its counter before the write
	// exists in this process by now, and learns of the floor.
	l.c.raiseFenceFloor(l.c.cfg.prefix+key, atLeast)
	return nil
}

// Close ends waiting Acquires with locking.ErrClosed, cancels the context of leases
// still held (their locks are no longer renewed), stops the pub/sub listener
// and joins every goroutine of the Locker. It does not close the client.
func (l *Locker) Close() error { return l.c.close() }

// single is the backend over one server. Waiting processes queue on the
// server and a release hands the lock straight to the oldest of them, with
// a pub/sub message: the woken waiter already holds the lock, so hand-over
// costs one script and one message, and no waiter can be overtaken.
type single struct {
	c      *core
	cfg    *config
	client Client
	node   string
	id     string // names this Locker's wake channels
}

func (s *single) channel(key string) string { return key + ":wake:" + s.id }

func (s *single) nodeErr(err error) error { return &locking.NodeError{Node: s.node, Err: err} }

type acquireReply struct {
	fence   int64
	pttl    time.Duration
	element string
}

// try runs the acquire script once: take the lock or keep our place in line.
func (s *single) try(ctx context.Context, a *attempt) (acquireReply, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.nodeTimeout)
	defer cancel()
	v, err := singleAcquire.Run(ctx, s.client, lockKeys(a.key),
		a.token, ms(s.cfg.ttl), ms(time.Until(a.deadline)), a.element, s.id).Slice()
	if err != nil {
		return acquireReply{}, s.nodeErr(err)
	}
	counter, pttl, el, err := triple(v)
	if err != nil {
		return acquireReply{}, s.nodeErr(err)
	}
	r := acquireReply{pttl: time.Duration(pttl) * time.Millisecond, element: el}
	if counter != 0 {
		if r.fence, err = startOf(counter); err != nil {
			return acquireReply{}, s.nodeErr(err)
		}
	}
	return r, nil
}

func (s *single) acquire(ctx context.Context, ks *keyState, a *attempt, g slotGrant) error {
	cfg := s.cfg
	if g.kind == grantGiven {
		a.fence, a.validUntil = g.fence, g.validUntil
		return nil
	}
	subs := s.c.watch(ks)
	if len(subs) == 0 {
		return s.c.notObtained(ctx, locking.ErrClosed)
	}
	sub := subs[0]
	sub.arm(a.inbox)
	defer sub.disarm(a.inbox)

	// notBefore is when we last saw the lock not ours: a hand-over happened
	// after it, so the lock lives at least until notBefore+ttl.
	var notBefore time.Time
	poll := true
	if g.kind == grantQueued {
		// Our predecessor put us in line. If we listened before it did, the
		// hand-over message will find us and no poll is needed.
		a.element, notBefore, poll = g.element, g.notBefore, !g.armed
	}
	var holderTTL time.Duration
	var nodeErr error
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		if poll {
			// Poll on a confirmed subscription, else a hand-over published
			// before the server registered us would wait for the next poll.
			select {
			case <-sub.readyC():
			default:
				t.Reset(cfg.pollInterval)
				select {
				case <-sub.readyC():
				case <-t.C:
				case <-ctx.Done():
					return s.c.notObtained(ctx, nodeErr)
				}
			}
			a.inbox.take() // the poll's answer supersedes what arrived so far
			sent := time.Now()
			r, err := s.try(ctx, a)
			switch {
			case err != nil:
				a.element = unknownElement
				if ctx.Err() != nil {
					return s.c.notObtained(ctx, err)
				}
				nodeErr, holderTTL = err, 0
			case r.fence > 0:
				a.fence, a.validUntil = r.fence, sent.Add(r.pttl-cfg.drift())
				return nil
			default:
				a.element, notBefore, holderTTL, nodeErr = r.element, sent, r.pttl, nil
			}
		}
		poll = true
		// Poll when the holder's TTL runs out (it may have died) or after
		// the poll interval, whichever is first.
		d := cfg.pollInterval
		if holderTTL > 0 && holderTTL+time.Millisecond < d {
			d = holderTTL + time.Millisecond
		}
		t.Reset(d)
		s.c.waiting(a.key)
		granted, err := s.wait(ctx, a, t, notBefore)
		if err != nil {
			return s.c.notObtained(ctx, errors.Join(err, nodeErr))
		}
		if granted {
			return nil
		}
	}
}

// wait waits for the hand-over to a, a hint to poll, or t.
func (s *single) wait(ctx context.Context, a *attempt, t *time.Timer, notBefore time.Time) (bool, error) {
	cfg := s.cfg
	for {
		select {
		case <-ctx.Done():
			return false, nil
		case <-t.C:
			return false, nil
		case <-a.inbox.c:
		}
		msgs, resync := a.inbox.take()
		if counter, ok := grantFor(a.token, msgs); ok {
			fence, err := startOf(counter)
			if err != nil {
				return false, s.nodeErr(err) // the lock is ours in Redis: leave deletes it
			}
			a.fence, a.validUntil = fence, notBefore.Add(cfg.ttl-cfg.drift())
			if time.Until(a.validUntil) > cfg.ttl/2 {
				return true, nil
			}
			// We last heard from the server long ago, so the lock may be
			// near its end: confirm it is ours and restart its clock.
			if until, err := s.extend(ctx, a); err == nil {
				a.validUntil = until
				return true, nil
			}
			a.fence = 0
			return false, nil
		}
		if resync {
			return false, nil
		}
	}
}

// grantFor finds the hand-over of the lock to token among msgs and returns
// the counter it took.
func grantFor(token string, msgs []string) (int64, bool) {
	for _, m := range msgs {
		tok, f, ok := strings.Cut(m, " ")
		if ok && tok == token {
			n, err := strconv.ParseInt(f, 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

func (s *single) extend(ctx context.Context, a *attempt) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.nodeTimeout)
	defer cancel()
	sent := time.Now()
	n, err := singleExtend.Run(ctx, s.client, []string{a.key}, a.token, ms(s.cfg.ttl)).Int64()
	if err != nil {
		return time.Time{}, s.nodeErr(err)
	}
	if n != 1 {
		return time.Time{}, fmt.Errorf("%w: %s expired or was taken", locking.ErrLockLost, a.key)
	}
	return sent.Add(s.cfg.ttl - s.cfg.drift()), nil
}

func (s *single) leave(ctx context.Context, a *attempt, next *attempt) (slotGrant, error) {
	if next == nil && a.fence == 0 && a.element == "" {
		return slotGrant{}, nil // never held, never queued
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.nodeTimeout)
	defer cancel()
	succ, sttl, swait := "", int64(0), int64(0)
	if next != nil {
		succ, sttl, swait = next.token, ms(s.cfg.ttl), ms(time.Until(next.deadline))
	}
	sent := time.Now()
	v, err := singleLeave.Run(ctx, s.client, lockKeys(a.key),
		a.token, a.element, succ, sttl, swait, s.id, ms(s.cfg.ttl)).Slice()
	var held, counter int64
	var el string
	if err == nil {
		held, counter, el, err = triple(v)
	}
	if err != nil {
		var g slotGrant
		if next != nil {
			// The script may have run, or may still land: it may have
			// queued next, or may yet. next polls at once and finds its
			// entry by its value rather than queue a second one (the
			// script does not queue it again either, see singleLeave).
			g = slotGrant{kind: grantQueued, element: unknownElement, notBefore: sent}
		}
		return g, s.nodeErr(err)
	}
	var g slotGrant
	switch {
	case next == nil:
	case counter > 0:
		if fence, err := startOf(counter); err == nil {
			g = slotGrant{kind: grantGiven, fence: fence, validUntil: sent.Add(s.cfg.ttl - s.cfg.drift())}
		} else {
			// next finds the lock its own in Redis when it polls, and the
			// poll reports the counter's error.
			g = slotGrant{kind: grantQueued, element: unknownElement, notBefore: sent}
		}
	default:
		g = slotGrant{kind: grantQueued, element: el, notBefore: sent, armed: true}
	}
	switch held {
	case 1:
		return g, nil
	case 0:
		return g, fmt.Errorf("%w: %s had expired", locking.ErrLockLost, a.key)
	default:
		return g, fmt.Errorf("%w: %s is held by someone else", locking.ErrLockLost, a.key)
	}
}

func (s *single) reset(ctx context.Context, key string) error {
	if err := resetScript.Run(ctx, s.client, lockKeys(key), ms(s.cfg.ttl)).Err(); err != nil {
		return s.nodeErr(err)
	}
	return nil
}

func (s *single) drain() {}
