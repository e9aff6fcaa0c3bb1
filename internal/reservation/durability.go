package reservation

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ErrNotDurable: a Redis that would lose an acknowledged order in a crash,
// or evict one under memory pressure.
var ErrNotDurable = errors.New("redis is not durable")

// CheckDurable checks that every server that holds reservations (the one
// server, or every master of a cluster) writes and fsyncs its append-only
// file before it answers: appendonly yes and appendfsync always. With
// anything less, an order answered 201 could vanish in a crash of Redis or
// of the machine. (Redis 7.0 has no WAITAOF; WAIT to a replica is not
// durability on disk either.)
func CheckDurable(ctx context.Context, rdb redis.UniversalClient) error {
	return forEachServer(ctx, rdb, checkAOF)
}

// CheckNoEviction checks that every server that holds reservations runs
// with maxmemory-policy noeviction: an evicted stream entry is an order
// answered 201 and never written, an evicted sale a SKU that fails closed.
// A full Redis must refuse new orders instead.
func CheckNoEviction(ctx context.Context, rdb redis.UniversalClient) error {
	return forEachServer(ctx, rdb, func(ctx context.Context, c redis.Cmdable) error {
		v, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		if err != nil {
			return fmt.Errorf("%w: %s: cannot read its maxmemory-policy (CONFIG GET): %w", ErrNotDurable, addrOf(c), err)
		}
		if p := v["maxmemory-policy"]; p != "noeviction" {
			return fmt.Errorf("%w: %s has maxmemory-policy %q, which may evict accepted orders; it needs noeviction", ErrNotDurable, addrOf(c), p)
		}
		return nil
	})
}

func forEachServer(ctx context.Context, rdb redis.UniversalClient, check func(context.Context, redis.Cmdable) error) error {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return check(ctx, c)
		})
	}
	return check(ctx, rdb)
}

func addrOf(c redis.Cmdable) string {
	if cl, ok := c.(*redis.Client); ok {
		return cl.Options().Addr
	}
	return "redis"
}

func checkAOF(ctx context.Context, c redis.Cmdable) error {
	addr := addrOf(c)
	settings, err := c.ConfigGet(ctx, "append*").Result()
	if err != nil {
		return fmt.Errorf("%w: %s: cannot read its configuration (CONFIG GET): %w", ErrNotDurable, addr, err)
	}
	aof, fsync := strings.ToLower(settings["appendonly"]), strings.ToLower(settings["appendfsync"])
	if aof != "yes" || fsync != "always" {
		return fmt.Errorf("%w: %s has appendonly %q and appendfsync %q; it needs appendonly yes and appendfsync always", ErrNotDurable, addr, aof, fsync)
	}
	return nil
}

// CheckMaster checks that every server that holds reservations is a
// master. A replica carries its master's replication id while its data
// lags behind it, so the scripts refuse to sell on one (a writable replica
// would otherwise sell units its master sold): a service pointed at a
// replica would answer 503 to every order. This says so at start instead.
func CheckMaster(ctx context.Context, rdb redis.UniversalClient) error {
	return forEachServer(ctx, rdb, func(ctx context.Context, c redis.Cmdable) error {
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return fmt.Errorf("%s: cannot read its role (INFO replication): %w", addrOf(c), err)
		}
		if role := infoField(info, "role"); role != "master" {
			return fmt.Errorf("%s is a %s, not a master: point REDIS_ADDRS at the master", addrOf(c), role)
		}
		return nil
	})
}
