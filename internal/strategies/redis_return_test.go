package strategies

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/redisconn"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/lab/testdb"
	"github.com/flashsale/stock/lab/testredis"
)

// TestOrdersSellWithin100msOfRedisAnsweringAgain: after an outage long
// enough to shut go-redis' dial gate (more failed dials than the pool
// holds connections: every new connection then fails with the last dial
// error until a background probe, once a second, gets through), an order
// through the reservation strategy, on the client the service builds for
// it, sells within 100 ms of Redis answering again. A client with
// go-redis' default options, through the same outage, is still refused
// then: without that, the outage did not shut the gate and the test
// shows nothing.
func TestOrdersSellWithin100msOfRedisAnsweringAgain(t *testing.T) {
	srv := testredis.StartDurable(t, "--maxmemory-policy", "noeviction")
	rdb, _ := newReserveClient(Config{RedisAddrs: []string{srv.Addr}})
	t.Cleanup(func() { _ = rdb.Close() })
	plain := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = plain.Close() })

	db := testdb.New(t, "postgres", 8)
	res := reservation.New(rdb, db, reservation.WithPipelines(4))
	svc := sales.NewService(db, reservation.NewReserved(res, db))
	ctx := context.Background()
	if err := svc.StartSale(ctx, "back", 100); err != nil {
		t.Fatal(err)
	}
	order := func(user string) error {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "back", Quantity: 1, UserID: user})
		return err
	}
	if err := order("before"); err != nil {
		t.Fatalf("order before the outage: %v", err)
	}
	if err := plain.Ping(ctx).Err(); err != nil {
		t.Fatalf("default client before the outage: %v", err)
	}

	srv.Stop()
	// Refused, and known to be: a refused connection sent nothing.
	if err := order("during"); !errors.Is(err, inventory.ErrUnavailable) || errors.Is(err, inventory.ErrOutcomeUnknown) {
		t.Fatalf("order while Redis is down: %v, want unavailable, not an unknown outcome", err)
	}
	failDials(t, rdb.(*redis.Client))
	failDials(t, plain)
	srv.Restart(t) // returns once the server answers PING
	answered := time.Now()

	for i := 0; ; i++ {
		err := order(fmt.Sprintf("after-%d", i))
		if err == nil {
			t.Logf("sold %v after Redis answered again, at attempt %d", time.Since(answered), i+1)
			break
		}
		if time.Since(answered) > 100*time.Millisecond {
			t.Fatalf("no order sold within 100 ms of Redis answering again (%d attempts): %v", i+1, err)
		}
	}
	// Well within the gate's second: the outage ended a few tens of
	// milliseconds ago.
	if err := plain.Ping(ctx).Err(); err == nil {
		t.Fatalf("a client with go-redis' default options was served %v after Redis answered again: "+
			"the outage did not shut its dial gate, so this test shows nothing", time.Since(answered))
	}
}

// failDials sends to a Redis that is down, all at once, twice as many
// commands as the larger of the client's pools holds connections, and as
// many pipelines (go-redis' dedicated pipeline pool): each pool fails
// more dials than its size, which shuts go-redis' dial gate. Every
// command must fail.
func failDials(t *testing.T, c *redis.Client) {
	t.Helper()
	n := 2 * max(c.Options().PoolSize, c.Options().PipelinePoolSize, redis.DefaultPipelinePoolSize)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := make(chan error, 2*n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { errs <- c.Ping(ctx).Err() })
		wg.Go(func() {
			_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error { p.Ping(ctx); return nil })
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err == nil {
			t.Fatal("a command succeeded with Redis down")
		}
	}
}

// TestFailedDialsLeftIdleAreNeverHandedOut: a caller that gives up while
// its connection is being dialed leaves the connection idle in go-redis'
// pool. A failed dial left so (redisDialer's failedDial) is dropped, not
// handed to the first command after Redis answers again.
func TestFailedDialsLeftIdleAreNeverHandedOut(t *testing.T) {
	srv := testredis.Start(t)
	c := redis.NewClient(redisconn.Options(srv.Addr))
	t.Cleanup(func() { _ = c.Close() })
	srv.Stop()
	for i := 0; c.PoolStats().IdleConns == 0; i++ {
		if i == 10_000 {
			t.Fatal("no dial was left idle by a caller that gave up, in 10,000 calls")
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Microsecond)
		_ = c.Ping(ctx).Err()
		cancel()
	}
	idle := c.PoolStats().IdleConns
	srv.Restart(t)
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("the first command after Redis answered again, with %d failed dials idle: %v", idle, err)
	}
}
