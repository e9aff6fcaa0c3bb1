package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/locking/redislock"
)

// TestTakeOverFromStalledHolder: a holder whose process stalls (its
// watchdog too) keeps the lock only until its TTL runs out; a waiter in
// another process must then get the lock promptly, not at the end of its
// own wait. This is what a frozen instance looks like to the others.
func TestTakeOverFromStalledHolder(t *testing.T) {
	const ttl = 300 * time.Millisecond
	type pair struct {
		name           string
		holder, waiter acquirer
		stall          func()
	}
	build := map[string]func(t *testing.T) pair{
		"single": func(t *testing.T) pair {
			srv := startRedis(t)
			h := newLocker(t, srv.Client(t), redislock.WithTTL(ttl))
			w := newLocker(t, srv.Client(t), redislock.WithTTL(ttl))
			return pair{"single", h, w, func() { h.SetRenewHook(pause(t)) }}
		},
		"redlock": func(t *testing.T) pair {
			_, hc := cluster(t, 3)
			wc := append(hc[:0:0], hc...)
			h := newRedlock(t, hc, redislock.WithTTL(ttl))
			w := newRedlock(t, wc, redislock.WithTTL(ttl))
			return pair{"redlock", h, w, func() { h.SetRenewHook(pause(t)) }}
		},
	}
	for name, b := range build {
		t.Run(name, func(t *testing.T) {
			p := b(t)
			p.stall()
			for i := range 10 {
				key := uniqueKey(t)
				held := acquire(t, p.holder, context.Background(), key)
				ctx, cancel := context.WithTimeout(context.Background(), 10*ttl)
				began := time.Now()
				lease, err := p.waiter.Acquire(ctx, key)
				waited := time.Since(began)
				cancel()
				if err != nil {
					t.Fatalf("round %d: the waiter did not take over a stalled holder's lock within %v: %v", i, 10*ttl, err)
				}
				t.Logf("round %d: took over after %v (tokens %d -> %d)", i, waited.Round(time.Millisecond), held.Token(), lease.Token())
				if lease.Token() <= held.Token() {
					t.Errorf("round %d: token %d after %d", i, lease.Token(), held.Token())
				}
				_ = lease.Release(context.Background())
				_ = held.Release(context.Background())
			}
		})
	}
}
