package reservation

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ErrNotDurable: a Redis that would lose an acknowledged order in a crash.
var ErrNotDurable = errors.New("redis is not durable")

// CheckDurable checks that every server that holds reservations (the one
// server, or every master of a cluster) writes and fsyncs its append-only
// file before it answers: appendonly yes and appendfsync always. With
// anything less, an order answered 201 could vanish in a crash of Redis or
// of the machine. (Redis 7.0 has no WAITAOF; WAIT to a replica is not
// durability on disk either.)
func CheckDurable(ctx context.Context, rdb redis.UniversalClient) error {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return checkServer(ctx, c)
		})
	}
	return checkServer(ctx, rdb)
}

func checkServer(ctx context.Context, c redis.Cmdable) error {
	addr := "redis"
	if cl, ok := c.(*redis.Client); ok {
		addr = cl.Options().Addr
	}
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
