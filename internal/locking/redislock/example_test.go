package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/locking"
	"github.com/flashsale/stock/internal/locking/redislock"
)

// The Examples run against servers TestMain starts (shared and
// exampleServers); in a service the clients point at your Redis. Each
// Example starts with Reset, which frees a lock left by an earlier run (go
// test -count=N) but keeps its fencing counter: tokens never go back, so the
// Examples print how tokens compare, not their values.

func ExampleLocker() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: shared.Addr, ContextTimeoutEnabled: true})
	defer rdb.Close()

	locker := redislock.New(rdb) // defaults: 5s TTL renewed every 5s/3
	defer locker.Close()
	_ = locker.Reset(ctx, "sku-42")

	lease, err := locker.Acquire(ctx, "sku-42")
	if err != nil {
		fmt.Println("not obtained:", err)
		return
	}
	// Work under lease.Context(): it is cancelled if the lock is lost.
	// Hand lease.Token() to the store so it can refuse stale writers.
	first := lease.Token()
	fmt.Println("token > 0:", first > 0)
	if err := lease.Release(ctx); err != nil {
		fmt.Println("lock was lost before release:", err)
	}

	lease, _ = locker.Acquire(ctx, "sku-42")
	fmt.Println("next holder's token is greater:", lease.Token() > first)
	_ = lease.Release(ctx)
	// Output:
	// token > 0: true
	// next holder's token is greater: true
}

func ExampleLocker_Acquire_reentrant() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: shared.Addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locker := redislock.New(rdb)
	defer locker.Close()
	_ = locker.Reset(ctx, "sku-7")

	outer, _ := locker.Acquire(ctx, "sku-7")
	// A helper called with the lease's context takes the same key again
	// instead of waiting for itself.
	inner, err := locker.Acquire(outer.Context(), "sku-7")
	fmt.Println(err, inner.Token() == outer.Token())
	_ = inner.Release(ctx) // still held by outer
	fmt.Println(outer.Release(ctx))
	// Output:
	// <nil> true
	// <nil>
}

func ExampleLease_Context() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: shared.Addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locker := redislock.New(rdb, redislock.WithRenewEvery(100*time.Millisecond))
	defer locker.Close()
	_ = locker.Reset(ctx, "sku-9")

	lease, _ := locker.Acquire(ctx, "sku-9")
	_ = locker.Reset(ctx, "sku-9") // an admin wipes the lock under us

	<-lease.Context().Done() // the watchdog's next renewal finds it gone
	fmt.Println(errors.Is(context.Cause(lease.Context()), locking.ErrLockLost))
	fmt.Println(errors.Is(lease.Release(ctx), locking.ErrLockLost))
	// Output:
	// true
	// true
}

func ExampleRedlock() {
	ctx := context.Background()
	var clients []*redis.Client
	for _, s := range exampleServers {
		// ContextTimeoutEnabled: the per-node timeout is a context deadline.
		c := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true})
		defer c.Close()
		clients = append(clients, c)
	}
	rl, err := redislock.NewRedlock(clients) // 3 independent servers
	if err != nil {
		fmt.Println(err)
		return
	}
	defer rl.Close()
	_ = rl.Reset(ctx, "sale-2026")

	lease, err := rl.Acquire(ctx, "sale-2026")
	if err != nil {
		fmt.Println("not obtained:", err)
		return
	}
	fmt.Println("token > 0:", lease.Token() > 0)
	fmt.Println(lease.Release(ctx))

	_, err = redislock.NewRedlock(clients[:2])
	fmt.Println(err)
	// Output:
	// token > 0: true
	// <nil>
	// locking: Redlock needs an odd number of at least 3 servers, got 2
}
