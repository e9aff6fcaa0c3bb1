package redislock

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/locking"
)

// Test hooks: compiled into the tests only.

// SetRenewHook makes the watchdogs call f before every renewal. An error
// from f counts as a failed renewal (the watchdog is killed); blocking in f
// stalls the watchdog (paused), so its lease is lost when validity ends.
func (l *Locker) SetRenewHook(f func(ctx context.Context, key string) error) { l.c.setRenewHook(f) }

// SetRenewHook: see Locker.SetRenewHook.
func (r *Redlock) SetRenewHook(f func(ctx context.Context, key string) error) { r.c.setRenewHook(f) }

// SetWaitHook makes an acquirer call f(redis key) each time it blocks
// waiting for the lock in Redis.
func (l *Locker) SetWaitHook(f func(key string)) { l.c.setWaitHook(f) }

// SetWaitHook: see Locker.SetWaitHook.
func (r *Redlock) SetWaitHook(f func(key string)) { r.c.setWaitHook(f) }

// SetGrantHook makes a goroutine that received the lock by local hand-over
// call f(redis key) before it takes it, as if it paused there.
func (l *Locker) SetGrantHook(f func(key string)) { l.c.setGrantHook(f) }

// SetGrantHook: see Locker.SetGrantHook.
func (r *Redlock) SetGrantHook(f func(key string)) { r.c.setGrantHook(f) }

// LocalWaiters reports how many goroutines of this Locker queue locally for
// key behind the one that talks to Redis.
func (l *Locker) LocalWaiters(key string) int { return l.c.localWaiters(key) }

// LocalWaiters: see Locker.LocalWaiters.
func (r *Redlock) LocalWaiters(key string) int { return r.c.localWaiters(key) }

func (c *core) localWaiters(key string) int { return c.queue.Waiting(c.cfg.prefix + key) }

// ArmedInboxes reports how many waiters' inboxes the subscriptions of key
// route messages to, summed over the servers.
func (l *Locker) ArmedInboxes(key string) int { return l.c.armedInboxes(key) }

// ArmedInboxes: see Locker.ArmedInboxes.
func (r *Redlock) ArmedInboxes(key string) int { return r.c.armedInboxes(key) }

func (c *core) armedInboxes(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	ks := c.keys[c.cfg.prefix+key]
	if ks == nil {
		return 0
	}
	n := 0
	for _, s := range ks.subs {
		s.n.mu.Lock()
		n += len(s.inboxes)
		s.n.mu.Unlock()
	}
	return n
}

// StopTimers stops the lease's watchdog and its expiry timer, as if its
// process had paused before either could run.
func (l *Lease) StopTimers() { l.h.stopRenewal(); l.h.expiry.Stop() }

// GateNode returns the index of key's gate node among the clients.
func (r *Redlock) GateNode(key string) int { return r.q.gate(r.c.cfg.prefix + key) }

// Value returns the lease's lock value in Redis.
func (l *Lease) Value() string { return l.h.a.token }

// LateCall names a call the client gave up on that reaches a server late.
type LateCall int

const (
	LatePoll   LateCall = iota // Locker: an acquire, or a waiter's poll
	LateRound                  // Redlock: an acquisition round's call
	LateExtend                 // Redlock: a renewal, which re-takes a missing key
	LateGate                   // Redlock: a gate call
)

// DeliverLate runs on c the script of call for the lock named key (default
// prefix) with value, as a call sent before value was released and
// delivered only now would.
func DeliverLate(ctx context.Context, c *redis.Client, call LateCall, key, value string, ttl time.Duration) error {
	k := "lock:" + key
	switch call {
	case LatePoll:
		return singleAcquire.Run(ctx, c, lockKeys(k), value, ms(ttl), ms(ttl), unknownElement, "late").Err()
	case LateRound:
		return redlockAcquire.Run(ctx, c, []string{k, k + ":fence"}, value, ms(ttl), 0).Err()
	case LateExtend:
		return redlockExtend.Run(ctx, c, []string{k, k + ":fence"}, value, ms(ttl), 0).Err()
	default:
		return redlockGate.Run(ctx, c, lockKeys(k), value, ms(ttl), ms(ttl), value).Err()
	}
}

// NewRedlockClients is newRedlock with clients that wrap *redis.Client, so
// that a test can hold calls back.
func NewRedlockClients(clients []Client, opts ...Option) (*Redlock, error) {
	return newRedlock(clients, opts...)
}

// TokenCounter is the counter in Redis (K:fence) of the chain token belongs
// to (its epoch, internal/locking's token.go).
func TokenCounter(token int64) int64 { return locking.EpochOf(token) }

// ChainStart is the token of the holder that took counter from Redis.
func ChainStart(counter int64) int64 { return counter << locking.PlaceBits }

// KeysKept counts the keys the Locker keeps state for (keyState).
func (l *Locker) KeysKept() int { return l.c.keysKept() }

// KeysKept: see Locker.KeysKept.
func (r *Redlock) KeysKept() int { return r.c.keysKept() }

func (c *core) keysKept() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.keys)
}
