package testredis_test

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale/stock/lab/testredis"
)

// The harness's own promise: a write both replicas confirmed (WAIT) is on
// the primary the Sentinels promote once the old one is killed.
func TestSentinelsPromoteTheReplicaWhenThePrimaryIsKilled(t *testing.T) {
	r := testredis.StartReplicated(t, testredis.SentinelOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old, err := r.Master(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := old.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Wait(ctx, 2, 5*time.Second).Result(); err != nil || n != 2 {
		t.Fatalf("WAIT: %d replicas, %v", n, err)
	}
	failedOver := r.WatchFailover(t, old)
	killed := time.Now()
	old.Stop()
	m, err := failedOver(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("promoted %s %s after the kill (down-after %s)", m.Addr, time.Since(killed).Round(time.Millisecond), r.DownAfter)
	if got, err := m.Client(t).Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("the promoted replica has k=%q (%v), want v", got, err)
	}
}
