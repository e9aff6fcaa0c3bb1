// Package backoff is how the service waits before it tries again: a lost
// compare-and-set, a busy lock table, a retried transaction, a poll of a
// lock's queue. It is written once here because the domain (inventory,
// batched) and the lock backends (internal/locking/...) both wait, and the
// domain imports no lock package.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Jitter spreads d over [d/2, d], so that pollers of several processes do
// not move in step.
func Jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d/2 + rand.N(d/2+1)
}

// Exponential is a random wait in [0, min(maxWait, base·2^attempt)] ("full
// jitter"): the losers of a race spread out instead of colliding again in
// step.
func Exponential(attempt int, base, maxWait time.Duration) time.Duration {
	ceiling := maxWait
	if attempt < 30 && base<<attempt < maxWait && base<<attempt > 0 {
		ceiling = base << attempt
	}
	if ceiling <= 0 {
		return 0
	}
	return rand.N(ceiling + 1)
}

// Wait waits d, or until ctx ends: then it returns context.Cause(ctx).
func Wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
