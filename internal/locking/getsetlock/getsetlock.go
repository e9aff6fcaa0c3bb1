// Package getsetlock is the lock older Redis articles describe before Redis
// had SET NX PX, kept here as a control that must be seen to fail:
//
//	acquire: SETNX key <expiry time>; taken when it answers 1. Otherwise
//	         GET key; if that time has passed, GETSET key <new expiry>
//	         and compare: the old value equal to the one read means this
//	         client took the expired lock, anything else that another did.
//	release: DEL key.
//
// Everything its critics point out is kept on purpose: the value is a time,
// not an owner, so a holder whose lock expired deletes its successor's lock
// on release; expiry is judged by each client's own clock, so a client with
// a clock ahead takes a lock that is still held; there is no renewal, no
// loss signal (a lease's context never ends) and no fencing token (0), so a
// paused holder writes after its lock passed to another. The losing GETSET
// of two racing clients also overwrites the winner's expiry. STRATEGY=
// legacy-getset runs the service's read-check-write under it, without
// fencing, and oversells when any of that happens.
package getsetlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/backoff"
	"github.com/flashsale/stock/internal/locking"
)

// Locker is the SETNX + GETSET lock on one Redis server.
type Locker struct {
	rdb    redis.Cmdable
	ttl    time.Duration
	wait   time.Duration
	prefix string
	now    func() time.Time
}

// Option configures New.
type Option func(*Locker)

// WithTTL sets how far ahead of its clock a client writes the expiry.
// Default 5s.
func WithTTL(d time.Duration) Option { return func(l *Locker) { l.ttl = d } }

// WithWait bounds how long Acquire polls for the lock. Default 3s.
func WithWait(d time.Duration) Option { return func(l *Locker) { l.wait = d } }

// WithPrefix sets the prefix of the lock keys. Default "legacy-lock:".
func WithPrefix(p string) Option { return func(l *Locker) { l.prefix = p } }

// WithClock sets the clock that writes and judges expiry times (a test
// skews it). Default time.Now.
func WithClock(now func() time.Time) Option { return func(l *Locker) { l.now = now } }

// New returns the legacy lock over rdb.
func New(rdb redis.Cmdable, opts ...Option) *Locker {
	l := &Locker{rdb: rdb, ttl: 5 * time.Second, wait: 3 * time.Second, prefix: "legacy-lock:", now: time.Now}
	for _, o := range opts {
		o(l)
	}
	return l
}

// Lease is one holding. It knows nothing of its lock after Acquire.
type Lease struct {
	l   *Locker
	key string
}

// Token is always 0: the recipe has no fencing token.
func (*Lease) Token() int64 { return 0 }

// Context never ends: the recipe cannot tell that its lock expired.
func (*Lease) Context() context.Context { return context.Background() }

// Release deletes the lock key, whoever holds it now.
func (le *Lease) Release(ctx context.Context) error {
	if err := le.l.rdb.Del(ctx, le.key).Err(); err != nil {
		return &locking.NodeError{Node: "redis", Err: err}
	}
	return nil
}

// Acquire polls for name's lock as the recipe does, every 1 to 10 ms, until
// it takes it or the wait (or ctx) ends.
func (l *Locker) Acquire(ctx context.Context, name string) (*Lease, error) {
	key := l.prefix + name
	ctx, cancel := context.WithTimeout(ctx, l.wait)
	defer cancel()
	for {
		took, err := l.try(ctx, key)
		if err != nil {
			if ctx.Err() != nil {
				return nil, errors.Join(locking.ErrNotObtained, ctx.Err())
			}
			return nil, &locking.NodeError{Node: "redis", Err: err}
		}
		if took {
			return &Lease{l: l, key: key}, nil
		}
		if backoff.Wait(ctx, time.Millisecond+rand.N(9*time.Millisecond)) != nil {
			return nil, errors.Join(locking.ErrNotObtained, ctx.Err())
		}
	}
}

// try is one round of the recipe.
func (l *Locker) try(ctx context.Context, key string) (bool, error) {
	expires := strconv.FormatInt(l.now().Add(l.ttl).UnixMilli(), 10)
	ok, err := l.rdb.SetNX(ctx, key, expires, 0).Result()
	if err != nil || ok {
		return ok, err
	}
	current, err := l.rdb.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return false, nil // released meanwhile: SETNX again next round
	}
	if err != nil {
		return false, err
	}
	at, err := strconv.ParseInt(current, 10, 64)
	if err != nil {
		return false, fmt.Errorf("lock %s holds %q, not a time", key, current)
	}
	if at > l.now().UnixMilli() {
		return false, nil // held, by this client's clock
	}
	old, err := l.rdb.GetSet(ctx, key, expires).Result()
	if errors.Is(err, redis.Nil) {
		return true, nil // deleted meanwhile, and now ours
	}
	if err != nil {
		return false, err
	}
	// Equal: this client replaced the expired value. Anything else:
	// another client got there first, and this GETSET has just
	// overwritten that client's expiry with ours.
	return old == current, nil
}

// Reset deletes the lock of name (a new sale).
func (l *Locker) Reset(ctx context.Context, name string) error {
	if err := l.rdb.Del(ctx, l.prefix+name).Err(); err != nil {
		return &locking.NodeError{Node: "redis", Err: err}
	}
	return nil
}

// AdvanceFence does nothing: there is no fencing counter.
func (*Locker) AdvanceFence(context.Context, string, int64) error { return nil }
