package strategies

import (
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/redisconn"
)

// RedisTuning is what a client of one Redis sets beyond redisconn's
// defaults; a zero field keeps go-redis' default.
type RedisTuning struct {
	PoolSize                  int
	ReadTimeout, WriteTimeout time.Duration
}

// RedisClient returns the client of the one Redis that every Redis user
// but Redlock and a Redis Cluster talks to, and where it points, for
// messages: the first of REDIS_ADDRS or, under REDIS_MODE=sentinel, the
// primary the Sentinels of REDIS_ADDRS know as REDIS_SENTINEL_MASTER,
// followed through failovers.
func RedisClient(cfg Config, t RedisTuning) (c *redis.Client, where string) {
	if cfg.RedisSentinelMaster != "" {
		o := redisconn.FailoverOptions(cfg.RedisSentinelMaster, cfg.RedisAddrs)
		o.PoolSize, o.ReadTimeout, o.WriteTimeout = t.PoolSize, t.ReadTimeout, t.WriteTimeout
		return redis.NewFailoverClient(o), "primary " + cfg.RedisSentinelMaster + " of the Sentinels " + strings.Join(cfg.RedisAddrs, ",")
	}
	o := redisconn.Options(cfg.RedisAddrs[0])
	o.PoolSize, o.ReadTimeout, o.WriteTimeout = t.PoolSize, t.ReadTimeout, t.WriteTimeout
	return redis.NewClient(o), cfg.RedisAddrs[0]
}
