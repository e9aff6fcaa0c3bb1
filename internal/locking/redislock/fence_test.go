package redislock_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/locking/redislock"
)

// fenceAdvancer is what both lock types offer for a counter that went back.
type fenceAdvancer interface {
	acquirer
	AdvanceFence(ctx context.Context, key string, atLeast int64) error
}

// TestAdvanceFence: after the servers lost their data the counter starts
// again from 1; AdvanceFence puts later tokens above what a store has seen,
// and never lowers the counter.
func TestAdvanceFence(t *testing.T) {
	ctx := context.Background()
	build := map[string]func(t *testing.T) (fenceAdvancer, []*redisServer){
		"single": func(t *testing.T) (fenceAdvancer, []*redisServer) {
			srv := startRedis(t)
			return newLocker(t, srv.Client(t)), []*redisServer{srv}
		},
		"redlock": func(t *testing.T) (fenceAdvancer, []*redisServer) {
			srvs, clients := cluster(t, 3)
			return newRedlock(t, clients), srvs
		},
	}
	for name, b := range build {
		t.Run(name, func(t *testing.T) {
			l, srvs := b(t)
			key := uniqueKey(t)
			var last int64
			for range 3 {
				lease := acquire(t, l, ctx, key)
				last = lease.Token()
				if err := lease.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			for _, s := range srvs {
				s.Stop()
				s.Restart(t)
			}
			lease := acquire(t, l, ctx, key)
			if lease.Token() > last {
				t.Fatalf("token %d after the wipe: the test needs a counter that went back", lease.Token())
			}
			_ = lease.Release(ctx)

			if err := l.AdvanceFence(ctx, key, 100); err != nil {
				t.Fatal(err)
			}
			if err := l.AdvanceFence(ctx, key, 50); err != nil { // never lowers
				t.Fatal(err)
			}
			lease = acquire(t, l, ctx, key)
			if lease.Token() <= 100 {
				t.Errorf("token %d after AdvanceFence(100)", lease.Token())
			}
			_ = lease.Release(ctx)
		})
	}
	var _ fenceAdvancer = (*redislock.Locker)(nil)
	var _ fenceAdvancer = (*redislock.Redlock)(nil)
}

// TestRedlockTokenFixedWithTheRound: an uncontended Redlock acquisition
// costs one gate call and one round, the token proposed in that round
// lands on every node; and when the gate node's counter is stale (it came
// back empty), the proposal is dropped and the token is still above every
// earlier one.
func TestRedlockTokenFixedWithTheRound(t *testing.T) {
	ctx := context.Background()
	srvs, clients := cluster(t, 3)
	key := uniqueKey(t)
	// cycle acquires and releases once with a Redlock of its own, closed
	// afterwards: Close joins the release calls that Release left running
	// once a majority had answered, so the servers' statistics are final.
	cycle := func() int64 {
		t.Helper()
		l := newRedlock(t, clients)
		lease := acquire(t, l, ctx, key)
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		return lease.Token()
	}
	counters := func() []int64 {
		t.Helper()
		var out []int64
		for _, c := range clients {
			n, err := c.Get(ctx, "lock:"+key+":fence").Int64()
			if err != nil && !errors.Is(err, redis.Nil) {
				t.Fatal(err)
			}
			out = append(out, n)
		}
		return out
	}
	cycle() // loads the scripts
	for _, c := range clients {
		if err := c.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	last := cycle()
	// Release joins the acquisition's calls to every node, so all three
	// ran the script that wrote the token.
	if c := redislock.TokenCounter(last); !slices.Equal(counters(), []int64{c, c, c}) {
		t.Fatalf("counters %v after token %d, want its counter %d on every node", counters(), last, c)
	}
	var scripts int64
	for _, c := range clients {
		scripts += scriptCalls(t, c)
	}
	// gate (1) + acquire round (3) + release round (3): no fence round.
	if scripts != 7 {
		t.Errorf("%d script calls for one acquire and release over 3 nodes, want 7", scripts)
	}

	probe, err := redislock.NewRedlock(clients)
	if err != nil {
		t.Fatal(err)
	}
	srv := srvs[probe.GateNode(key)]
	_ = probe.Close()
	srv.Stop()
	srv.Restart(t) // empty: its counter is 0, so its proposal is 1
	token := cycle()
	if token <= last {
		t.Fatalf("token %d after %d: a stale gate's proposal was taken", token, last)
	}
	// The second round writes the token where the key is ours; a late
	// answer of the first may set the key on a node after that, so only a
	// majority is sure to carry it.
	carrying := 0
	for _, n := range counters() {
		if n >= redislock.TokenCounter(token) {
			carrying++
		}
	}
	if carrying < 2 {
		t.Errorf("counters %v: fewer than a majority carry the token %d", counters(), token)
	}
}

// scriptCalls returns the EVALSHA and EVAL calls a server counted.
func scriptCalls(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	stats := commandStats(t, c)
	return stats["evalsha"] + stats["eval"]
}
