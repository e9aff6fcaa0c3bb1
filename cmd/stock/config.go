package main

import (
	"log/slog"
	"net/url"

	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/flashsale/stock/internal/envconf"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
)

// config is the service's configuration, read from the environment. Each
// field's default is in loadConfig.
type config struct {
	Strategy        string
	DatabaseURL     string
	HTTPAddr        string
	AdminToken      string
	DBMaxConns      int
	OrderTimeout    time.Duration
	CASMaxAttempts  int
	CASMaxInFlight  int
	RowMaxInFlight  int
	NaiveRaceWindow time.Duration
	BatchMax        int
	BatchWait       time.Duration
	BatchLanes      int
	Migrate         bool
	ShutdownTimeout time.Duration
	ReadTimeout     time.Duration
	LogLevel        slog.Level
	// HTTPMaxConns caps the HTTP connections held at once, below the
	// descriptor limit (see conns.go); HTTPIdleTimeout closes a keep-alive
	// connection idle that long.
	HTTPMaxConns    int
	HTTPIdleTimeout time.Duration

	// Lock strategies (redis-lock, redlock, etcd-lock, zk-lock, db-lock).
	RedisAddrs     []string
	EtcdEndpoints  []string
	ZKServers      []string
	LockTTL        time.Duration
	LockWait       time.Duration
	LockRenewEvery time.Duration
	// HoldTTL holds each new order that long for payment (0: orders are
	// final at once); HoldSweepEvery is the period of the job that expires
	// lapsed holds and returns their units (0: off; holds then expire only
	// when read).
	HoldTTL        time.Duration
	HoldSweepEvery time.Duration
	// PerUserLimit bounds the units one user_id holds or has paid for per
	// SKU and sale (0: no limit).
	PerUserLimit int
	// SoldOutTTL is how long an order refused sold out lets an instance
	// refuse the SKU's orders without asking the store (0: never).
	SoldOutTTL time.Duration
	// AuditEvery is the audit job's period (0: off); one instance a
	// period runs it, under the job lock of the lock table.
	AuditEvery time.Duration
	// AdmissionLimit bounds the orders of one SKU in the database at once,
	// across the instances (a semaphore on Redis); 0: off.
	AdmissionLimit int
	// JobLock is where the periodic jobs' single-run lock lives: "table"
	// (the lock table) or "redis" (the first of RedisAddrs).
	JobLock      string
	Fencing      bool
	FreezeHolder bool
	// SkipPolicyCheck starts even where the Redis eviction policy cannot be
	// read (CONFIG disabled or renamed): the operator vouches for noeviction.
	SkipPolicyCheck bool

	// redis-reserve and redis-watch: Durable refuses a Redis without an fsynced AOF
	// (RESERVE_DURABILITY=aof); ClaimIdle is how long a dead consumer's
	// orders wait before another instance writes them.
	ReserveDurable   bool
	ReserveClaimIdle time.Duration
	// ReservePipelines bounds the pipelines of reserve scripts in flight
	// per instance (redis-reserve; 0: a round trip per order).
	ReservePipelines int
	// ReconcileEvery is how often one instance compares Redis with the
	// database for every SKU on sale (0: never).
	ReconcileEvery time.Duration
	// RedisCluster: REDIS_ADDRS are the seeds of one Redis Cluster
	// (REDIS_MODE=cluster), not independent servers.
	RedisCluster bool
	// RedisSentinelMaster: REDIS_ADDRS are Sentinels, and the Redis is the
	// primary they know by this name (REDIS_MODE=sentinel); "" otherwise.
	RedisSentinelMaster string
	// ReserveWaitReplicas and ReserveWaitTimeout: an order of the
	// reservation strategies is answered 201 once this many replicas
	// have it (WAIT), or 503 after the timeout.
	ReserveWaitReplicas int
	ReserveWaitTimeout  time.Duration
}

// strategyConfig is the part of the configuration the strategies' entries
// build from.
func (c config) strategyConfig() strategies.Config {
	return strategies.Config{
		Strategy: c.Strategy, DatabaseURL: c.DatabaseURL, OrderTimeout: c.OrderTimeout,
		RowMaxInFlight: c.RowMaxInFlight, CASMaxAttempts: c.CASMaxAttempts, CASMaxInFlight: c.CASMaxInFlight,
		NaiveRaceWindow: c.NaiveRaceWindow, AdmissionLimit: c.AdmissionLimit, BatchMax: c.BatchMax, BatchWait: c.BatchWait, BatchLanes: c.BatchLanes,
		RedisAddrs: c.RedisAddrs, EtcdEndpoints: c.EtcdEndpoints, ZKServers: c.ZKServers,
		LockTTL: c.LockTTL, LockWait: c.LockWait, LockRenewEvery: c.LockRenewEvery,
		Fencing: c.Fencing, FreezeHolder: c.FreezeHolder, SkipPolicyCheck: c.SkipPolicyCheck,
		RedisCluster: c.RedisCluster, RedisSentinelMaster: c.RedisSentinelMaster,
		ReserveDurable: c.ReserveDurable, ReserveClaimIdle: c.ReserveClaimIdle,
		ReservePipelines: c.ReservePipelines, ReconcileEvery: c.ReconcileEvery,
		ReserveWaitReplicas: c.ReserveWaitReplicas, ReserveWaitTimeout: c.ReserveWaitTimeout,
	}
}

// minAdminTokenLength is the shortest ADMIN_TOKEN the service accepts: the
// admin routes reset sales, so a guessable token ("change-me", "secret") is
// refused at start.
const minAdminTokenLength = 16

// addrList splits a comma-separated list of addresses.
func addrList(s string) []string {
	var out []string
	for _, addr := range strings.Split(s, ",") {
		if addr = strings.TrimSpace(addr); addr != "" {
			out = append(out, addr)
		}
	}
	return out
}

// loadConfig reads the configuration through getenv and reports every
// invalid value at once.
func loadConfig(getenv func(string) string) (config, error) {
	env := envconf.New(getenv)
	str, integer, duration, boolean, bad := env.String, env.Int, env.Duration, env.Bool, env.Bad
	// The strategies' settings default to the registry's.
	def := strategies.Defaults()
	c := config{
		Strategy:        str("STRATEGY", def.Strategy),
		DatabaseURL:     str("DATABASE_URL", ""),
		HTTPAddr:        str("HTTP_ADDR", ":8080"),
		AdminToken:      getenv("ADMIN_TOKEN"),
		DBMaxConns:      integer("DB_MAX_CONNS", 16, 1, 1000),
		OrderTimeout:    duration("ORDER_TIMEOUT", def.OrderTimeout, false),
		CASMaxAttempts:  integer("CAS_MAX_ATTEMPTS", def.CASMaxAttempts, 1, 10000),
		CASMaxInFlight:  integer("CAS_MAX_IN_FLIGHT", def.CASMaxInFlight, 0, 1000),
		RowMaxInFlight:  integer("ROW_MAX_IN_FLIGHT", def.RowMaxInFlight, 0, 1000),
		NaiveRaceWindow: duration("NAIVE_RACE_WINDOW", def.NaiveRaceWindow, true),
		BatchMax:        integer("BATCH_MAX", def.BatchMax, 1, 10000),
		BatchWait:       duration("BATCH_WAIT", def.BatchWait, true),
		BatchLanes:      integer("BATCH_LANES", def.BatchLanes, 0, 1024),
		Migrate:         boolean("MIGRATE", true),
		ShutdownTimeout: duration("SHUTDOWN_TIMEOUT", 10*time.Second, false),
		ReadTimeout:     duration("HTTP_READ_TIMEOUT", 10*time.Second, false),
		// Seconds, not a minute: a buyer reuses a connection within a
		// checkout; past that an idle connection is a descriptor and a
		// goroutine held for a client that may not come back, and it
		// costs the client one reconnect.
		HTTPIdleTimeout: duration("HTTP_IDLE_TIMEOUT", 5*time.Second, false),
		LockTTL:         duration("LOCK_TTL", def.LockTTL, false),
		LockWait:        duration("LOCK_WAIT", def.LockWait, false),
		LockRenewEvery:  duration("LOCK_RENEW_EVERY", def.LockRenewEvery, true),
		FreezeHolder:    boolean("FREEZE_HOLDER", false),
		SkipPolicyCheck: boolean("REDIS_SKIP_POLICY_CHECK", false),
		// A dead consumer's orders wait this long: well past a healthy
		// batch's write, well within what a buyer tolerates between the
		// 201 and the order row.
		ReserveClaimIdle: duration("RESERVE_CLAIM_IDLE", def.ReserveClaimIdle, false),
		ReservePipelines: integer("RESERVE_PIPELINES", def.ReservePipelines, 0, 64),
		ReconcileEvery:   duration("RESERVE_RECONCILE_EVERY", def.ReconcileEvery, true),
		AuditEvery:       duration("AUDIT_EVERY", 30*time.Second, true),
		HoldTTL:          duration("HOLD_TTL", 0, true),
		// The sweep runs whatever HOLD_TTL is, so that holds placed under
		// an earlier setting still come back; with none held it is one
		// indexed query a period.
		HoldSweepEvery: duration("HOLD_SWEEP_EVERY", time.Second, true),
		PerUserLimit:   integer("PER_USER_LIMIT", 0, 0, inventory.MaxInitialStock),
		SoldOutTTL:     duration("SOLD_OUT_TTL", sales.DefaultSoldOutTTL, true),
		AdmissionLimit: integer("ADMISSION_LIMIT", def.AdmissionLimit, 0, 1000),
		JobLock:        str("JOB_LOCK", "table"),
	}
	switch d := str("RESERVE_DURABILITY", "aof"); d {
	case "aof":
		c.ReserveDurable = true
	case "none":
		c.ReserveDurable = false
	default:
		bad("RESERVE_DURABILITY=%q is not aof or none", d)
	}
	switch m := str("REDIS_MODE", "standalone"); m {
	case "standalone":
	case "cluster":
		c.RedisCluster = true
	case "sentinel":
		c.RedisSentinelMaster = str("REDIS_SENTINEL_MASTER", strategies.DefaultSentinelMaster)
		// Behind Sentinel an order waits for a replica by default: a
		// failover must not lose a 201.
		def.ReserveWaitReplicas = 1
	default:
		bad("REDIS_MODE=%q is not standalone, cluster or sentinel", m)
	}
	if getenv("REDIS_SENTINEL_MASTER") != "" && c.RedisSentinelMaster == "" {
		bad("REDIS_SENTINEL_MASTER applies only to REDIS_MODE=sentinel")
	}
	c.ReserveWaitReplicas = integer("RESERVE_WAIT_REPLICAS", def.ReserveWaitReplicas, 0, 16)
	c.ReserveWaitTimeout = duration("RESERVE_WAIT_TIMEOUT", def.ReserveWaitTimeout, false)
	if c.RedisCluster && c.ReserveWaitReplicas > 0 {
		// WAIT counts one node's replicas; a pipeline of a cluster
		// client sends it to whichever node.
		bad("RESERVE_WAIT_REPLICAS applies only to one Redis (REDIS_MODE=standalone or sentinel), not to REDIS_MODE=cluster")
	}
	if c.ReserveWaitTimeout < time.Millisecond || c.ReserveWaitTimeout >= c.OrderTimeout {
		bad("RESERVE_WAIT_TIMEOUT=%s must be at least 1ms and shorter than ORDER_TIMEOUT=%s", c.ReserveWaitTimeout, c.OrderTimeout)
	}
	switch f := str("FENCING", "on"); f {
	case "on":
		c.Fencing = true
	case "off":
		c.Fencing = false
	default:
		bad("FENCING=%q is not on or off", f)
	}
	c.RedisAddrs = addrList(str("REDIS_ADDRS", strings.Join(def.RedisAddrs, ",")))
	c.EtcdEndpoints = addrList(str("ETCD_ENDPOINTS", strings.Join(def.EtcdEndpoints, ",")))
	c.ZKServers = addrList(str("ZK_SERVERS", strings.Join(def.ZKServers, ",")))
	// What only some strategies read, and what a strategy cannot run
	// with, is its registry entry's to say (Settings, Check).
	if err := strategies.Check(c.strategyConfig(), func(setting string) bool {
		name, value, valued := strings.Cut(setting, "=")
		if valued {
			return getenv(name) == value
		}
		switch name {
		case "FREEZE_HOLDER":
			return c.FreezeHolder
		case "ADMISSION_LIMIT":
			return c.AdmissionLimit > 0
		case "NAIVE_RACE_WINDOW":
			return c.NaiveRaceWindow > 0
		case "REDIS_SKIP_POLICY_CHECK":
			return c.SkipPolicyCheck
		}
		return getenv(name) != ""
	}); err != nil {
		bad("%v", err)
	}
	if c.DatabaseURL == "" {
		bad("DATABASE_URL is required, e.g. postgres://postgres@127.0.0.1:5432/stock?sslmode=disable or mysql://root@127.0.0.1:3306/stock")
	} else if _, err := store.Engine(c.DatabaseURL); err != nil {
		bad("%v", err)
	}
	if err := c.LogLevel.UnmarshalText([]byte(str("LOG_LEVEL", "info"))); err != nil {
		bad("LOG_LEVEL=%q is not debug, info, warn or error", getenv("LOG_LEVEL"))
	}
	if n := utf8.RuneCountInString(c.AdminToken); n > 0 && n < minAdminTokenLength {
		// The length only: the token itself never reaches a log.
		bad("ADMIN_TOKEN must be at least %d characters (it has %d); unset it to disable the admin routes", minAdminTokenLength, n)
	}
	if c.BatchWait > 0 && c.BatchWait >= c.OrderTimeout {
		bad("BATCH_WAIT=%s must be shorter than ORDER_TIMEOUT=%s: a leader would wait out its order's deadline", c.BatchWait, c.OrderTimeout)
	}
	if c.JobLock != "table" && c.JobLock != "redis" {
		bad("JOB_LOCK=%q is not table or redis", c.JobLock)
	}
	if c.HoldTTL > 0 && c.HoldTTL < time.Second {
		bad("HOLD_TTL=%s is shorter than a second: a buyer could not pay in time", c.HoldTTL)
	}
	// A cap the descriptor limit cannot hold is refused: the process would
	// meet EMFILE before the cap, the failure the cap is there to prevent.
	nofile := openFileLimit()
	dbConns := store.Connections(c.DatabaseURL, c.DBMaxConns)
	reserve := descriptorReserve(nofile, dbConns)
	c.HTTPMaxConns = defaultHTTPMaxConns(nofile, dbConns)
	if v := str("HTTP_MAX_CONNS", ""); v != "" {
		switch n, err := strconv.Atoi(v); {
		case err != nil || n < 1:
			bad("HTTP_MAX_CONNS=%q is not a positive integer", v)
		case n > nofile-reserve:
			bad("HTTP_MAX_CONNS=%d is more than the process's %d file descriptors (RLIMIT_NOFILE) hold beside the %d kept for the database pool, the operator headroom and other files: at most %d",
				n, nofile, reserve, nofile-reserve)
		default:
			c.HTTPMaxConns = n
		}
	}
	return c, env.Err()
}

// logAttrs describes the effective configuration with secrets masked.
func (c config) logAttrs() []any {
	admin := "unset (admin routes answer 403)"
	if c.AdminToken != "" {
		admin = "set"
	}
	return []any{
		"strategy", c.Strategy,
		"database_url", redactURL(c.DatabaseURL),
		"http_addr", c.HTTPAddr,
		"admin_token", admin,
		"db_max_conns", c.DBMaxConns,
		"order_timeout", c.OrderTimeout.String(),
		"http_read_timeout", c.ReadTimeout.String(),
		"http_max_conns", c.HTTPMaxConns,
		"http_idle_timeout", c.HTTPIdleTimeout.String(),
		"cas_max_attempts", c.CASMaxAttempts,
		"cas_max_in_flight", c.CASMaxInFlight,
		"row_max_in_flight", c.RowMaxInFlight,
		"naive_race_window", c.NaiveRaceWindow.String(),
		"batch_max", c.BatchMax,
		"batch_wait", c.BatchWait.String(),
		"batch_lanes", c.BatchLanes,
		"migrate", c.Migrate,
		"log_level", c.LogLevel.String(),
		"redis_addrs", strings.Join(c.RedisAddrs, ","),
		"etcd_endpoints", strings.Join(c.EtcdEndpoints, ","),
		"zk_servers", strings.Join(c.ZKServers, ","),
		"lock_ttl", c.LockTTL.String(),
		"lock_wait", c.LockWait.String(),
		"lock_renew_every", c.LockRenewEvery.String(),
		"audit_every", c.AuditEvery.String(),
		"hold_ttl", c.HoldTTL.String(),
		"hold_sweep_every", c.HoldSweepEvery.String(),
		"per_user_limit", c.PerUserLimit,
		"admission_limit", c.AdmissionLimit,
		"job_lock", c.JobLock,
		"fencing", c.Fencing,
		"freeze_holder", c.FreezeHolder,
		"redis_skip_policy_check", c.SkipPolicyCheck,
		"reserve_durable", c.ReserveDurable,
		"reserve_claim_idle", c.ReserveClaimIdle.String(),
		"reserve_pipelines", c.ReservePipelines,
		"redis_cluster", c.RedisCluster,
		"redis_sentinel_master", c.RedisSentinelMaster,
		"reserve_wait_replicas", c.ReserveWaitReplicas,
		"reserve_wait_timeout", c.ReserveWaitTimeout.String(),
		"reserve_reconcile_every", c.ReconcileEvery.String(),
	}
}

func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable)"
	}
	return u.Redacted()
}
