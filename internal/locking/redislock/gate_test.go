package redislock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/locking/redislock"
)

// holdBackClient holds back the next script call whose shape matches
// (number of keys and arguments) once armed: the caller sees a timeout at
// once, and the call reaches the server when the test delivers it.
type holdBackClient struct {
	*redis.Client
	nkeys, nargs int
	mu           sync.Mutex
	armed        bool
	stashed      func() error
}

func (c *holdBackClient) match(keys []string, args []any) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.armed && len(keys) == c.nkeys && len(args) == c.nargs
}

func (c *holdBackClient) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	if c.match(keys, args) {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(redis.ErrNoScript) // Script.Run falls back to Eval, which has the body
		return cmd
	}
	return c.Client.EvalSha(ctx, sha, keys, args...)
}

func (c *holdBackClient) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	if c.match(keys, args) {
		c.mu.Lock()
		c.armed = false
		c.stashed = func() error { return c.Client.Eval(context.Background(), script, keys, args...).Err() }
		c.mu.Unlock()
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(context.DeadlineExceeded)
		return cmd
	}
	return c.Client.Eval(ctx, script, keys, args...)
}

// TestRedlockGiveUpRetiresTokenOnStandInGateOnly: W's gate call to the
// key's gate node g0 times out (it is held back), so W passes g0 over and
// queues at the stand-in gate g1 behind the holder H. W's wait ends: it
// retires its token on a.gate = g1 only. H releases. W's gate call then
// lands on g0: the key is free there and nobody is queued, so the gate
// script SETs it to W's value — a value that gave up, that nobody will
// delete — and g0 is every contender's gate again: each finds the gate
// "taken" with no release to come, for a TTL.
func TestRedlockGiveUpRetiresTokenOnStandInGateOnly(t *testing.T) {
	ctx := context.Background()
	_, clients := cluster(t, 3)
	const ttl = 30 * time.Second
	holder := newRedlock(t, clients, redislock.WithTTL(ttl))
	key := uniqueKey(t)
	g0 := holder.GateNode(key)
	wrapped := make([]redislock.Client, len(clients))
	var held *holdBackClient
	for i, c := range clients {
		hc := &holdBackClient{Client: c, nkeys: 3, nargs: 4} // redlockGate
		if i == g0 {
			hc.armed, held = true, hc
		}
		wrapped[i] = hc
	}
	w, err := redislock.NewRedlockClients(wrapped, redislock.WithTTL(ttl), redislock.WithNodeTimeout(500*time.Millisecond),
		redislock.WithWait(300*time.Millisecond), redislock.WithPollInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })

	h := acquire(t, holder, ctx, key)
	if _, err := w.Acquire(ctx, key); err == nil {
		t.Fatal("W got the lock while H holds it")
	}
	held.mu.Lock()
	deliver := held.stashed
	held.mu.Unlock()
	if deliver == nil {
		t.Fatal("no gate call to g0 was held back")
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := deliver(); err != nil { // W's gate call lands on g0 now
		t.Fatal(err)
	}
	if v, err := clients[g0].Get(ctx, "lock:"+key).Result(); !errors.Is(err, redis.Nil) {
		pttl, _ := clients[g0].PTTL(ctx, "lock:"+key).Result()
		t.Errorf("gate node g0 holds %q for %v after W gave up and H released (err %v), want it free", v, pttl, err)
	}
	// A contender that trusts the gate waits for an announcement that never
	// comes, until the phantom expires (poll interval 1h here).
	x := newRedlock(t, clients, redislock.WithTTL(ttl), redislock.WithPollInterval(time.Hour))
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	l, err := x.Acquire(wctx, key)
	if err != nil {
		t.Fatalf("a free lock is not obtained within 2s: %v", err)
	}
	_ = l.Release(ctx)
}
