// Package strategies is the registry that builds every strategy: one entry
// per STRATEGY value says what the strategy is (Info),
// which settings only it reads, what configuration it refuses, and how it
// is built from the database and the servers it needs. cmd/stock, the
// demo, the fault suite, the RSS tool and the tests loop over the entries
// and never switch on a name: adding a deduct-only strategy is its file
// and its entry here; a lock backend, its package, its conformance test
// and its entry (lockEntry).
package strategies

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/jobs"
	"github.com/flashsale/stock/internal/metrics"
	"github.com/flashsale/stock/internal/store"
)

// Config is what the entries build from: cmd/stock fills it from the
// environment (the variable of each field is in docs/configuration.md).
type Config struct {
	Strategy    string
	DatabaseURL string
	// OrderTimeout is an order's deadline (the admission's permits outlive
	// it).
	OrderTimeout time.Duration
	// The SQL row strategies.
	RowMaxInFlight  int
	CASMaxAttempts  int
	CASMaxInFlight  int
	NaiveRaceWindow time.Duration
	AdmissionLimit  int
	// batched.
	BatchMax   int
	BatchWait  time.Duration
	BatchLanes int
	// The lock strategies.
	RedisAddrs      []string
	EtcdEndpoints   []string
	ZKServers       []string
	LockTTL         time.Duration
	LockWait        time.Duration
	LockRenewEvery  time.Duration
	Fencing         bool
	FreezeHolder    bool
	SkipPolicyCheck bool
	// RedisSentinelMaster: REDIS_ADDRS are Sentinels, and every client of
	// one Redis (RedisClient) reaches the primary they know by this name
	// (REDIS_MODE=sentinel); "" otherwise.
	RedisSentinelMaster string
	// The reservation strategies.
	RedisCluster     bool
	ReserveDurable   bool
	ReserveClaimIdle time.Duration
	ReservePipelines int
	ReconcileEvery   time.Duration
	// ReserveWaitReplicas and ReserveWaitTimeout: an order is answered 201
	// once this many replicas have it (reservation.WithReplicas).
	ReserveWaitReplicas int
	ReserveWaitTimeout  time.Duration
}

// DefaultSentinelMaster is REDIS_SENTINEL_MASTER's default, the name
// Redis's own sentinel.conf gives its primary.
const DefaultSentinelMaster = "mymaster"

// Defaults is the configuration of every setting left unset, as
// docs/configuration.md documents it: cmd/stock reads each variable over
// it, and a test builds a strategy from it.
func Defaults() Config {
	return Config{
		Strategy:         NameConditional,
		OrderTimeout:     3 * time.Second,
		RowMaxInFlight:   4,
		CASMaxAttempts:   50,
		CASMaxInFlight:   2,
		BatchMax:         256,
		BatchLanes:       LanesByEngine,
		RedisAddrs:       []string{"127.0.0.1:6379"},
		EtcdEndpoints:    []string{"127.0.0.1:2379"},
		ZKServers:        []string{"127.0.0.1:2181"},
		LockTTL:          5 * time.Second,
		LockWait:         3 * time.Second,
		Fencing:          true,
		ReserveDurable:   true,
		ReserveClaimIdle: 5 * time.Second,
		ReservePipelines: 4,
		ReconcileEvery:   30 * time.Second,
		// RESERVE_WAIT_REPLICAS: 0, or 1 under REDIS_MODE=sentinel
		// (cmd/stock).
		ReserveWaitTimeout: 500 * time.Millisecond,
	}
}

// Deps are the running parts an entry builds with.
type Deps struct {
	DB      store.Store
	Metrics *metrics.Metrics
	// Jobs runs the periodic jobs a strategy adds (the reservation's
	// reconciler).
	Jobs *jobs.Scheduler
	Log  *slog.Logger
}

// Entry is one strategy of the registry.
type Entry struct {
	Info
	// New builds a strategy that only deducts (a Deduct through the
	// service's transaction) with its default options, without a server
	// or a setting: the conformance test and the schedule explorer build
	// it from here. nil for a strategy that needs wiring (servers, a
	// store).
	New func() inventory.Strategic
	// Settings are the variables only the strategies that list them read
	// (a setting no entry of the configured strategy lists is refused).
	Settings []string
	// Check refuses a configuration the strategy cannot run with; nil
	// when it takes any.
	Check func(Config) error
	// Build builds the strategy from cfg and deps; stop releases what it
	// holds (clients, listeners) and ends what it runs (a consumer).
	Build func(ctx context.Context, cfg Config, deps Deps) (s inventory.Strategy, stop func(), err error)
}

// Safe reports whether the strategy is not a control.
func (s Info) Safe() bool { return s.Class == ClassSafe }

// NeedsServer reports whether the strategy needs srv.
func (s Info) NeedsServer(srv Server) bool { return slices.Contains(s.Needs, srv) }

// All returns every entry, in the order `stock strategies` lists them.
func All() []Entry { return slices.Clone(registry) }

// Lookup returns the entry of name.
func Lookup(name string) (Entry, bool) {
	i := slices.IndexFunc(registry, func(e Entry) bool { return e.Name == name })
	if i < 0 {
		return Entry{}, false
	}
	return registry[i], true
}

// Names lists every value STRATEGY accepts.
func Names() []string { return namesWhere(func(Info) bool { return true }) }

// IsControl reports whether name is a registered control.
func IsControl(name string) bool {
	e, ok := Lookup(name)
	return ok && e.Class == ClassControl
}

func namesWhere(keep func(Info) bool) []string {
	var names []string
	for _, e := range registry {
		if keep(e.Info) {
			names = append(names, e.Name)
		}
	}
	return names
}

// The lists by family that the wiring and the tests use.
var (
	// SQLNames: one order per transaction, the control included.
	SQLNames = namesWhere(func(s Info) bool { return s.Family == FamilySQL })
	// LockNames: the safe strategies that deduct under a distributed lock
	// with a fencing token (legacy-getset, a lock without one, is not
	// among them).
	LockNames = namesWhere(func(s Info) bool { return s.Family == FamilyLock && s.Safe() })
	// ReservedNames: the stock counted in Redis.
	ReservedNames = namesWhere(func(s Info) bool { return s.Family == FamilyReserved })
)

// Build builds cfg.Strategy.
func Build(ctx context.Context, cfg Config, deps Deps) (inventory.Strategy, func(), error) {
	e, ok := Lookup(cfg.Strategy)
	if !ok {
		return inventory.Strategy{}, nil, fmt.Errorf("STRATEGY=%q is unknown; valid: %s", cfg.Strategy, strings.Join(Names(), ", "))
	}
	if deps.Log == nil {
		deps.Log = slog.Default()
	}
	if deps.Metrics == nil {
		deps.Metrics = metrics.New()
	}
	s, stop, err := e.Build(ctx, cfg, deps)
	if err != nil {
		return inventory.Strategy{}, nil, err
	}
	if err := s.Validate(); err != nil {
		stop()
		return inventory.Strategy{}, nil, err
	}
	return s, stop, nil
}

// Check refuses a configuration cfg.Strategy cannot run with, and the
// settings set (by name, as set reports them) that it does not read.
func Check(cfg Config, set func(setting string) bool) error {
	e, ok := Lookup(cfg.Strategy)
	if !ok {
		return fmt.Errorf("STRATEGY=%q is unknown; valid: %s", cfg.Strategy, strings.Join(Names(), ", "))
	}
	var errs []string
	for _, setting := range settings() {
		if set(setting) && !slices.Contains(e.Settings, setting) {
			errs = append(errs, fmt.Sprintf("%s applies only to STRATEGY=%s", setting, orList(readers(setting))))
		}
	}
	if e.Check != nil {
		if err := e.Check(cfg); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// settings lists every setting some entry reads alone, in order.
func settings() []string {
	var out []string
	for _, e := range All() {
		for _, s := range e.Settings {
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}

// readers lists the strategies that read setting.
func readers(setting string) []string {
	var out []string
	for _, e := range All() {
		if slices.Contains(e.Settings, setting) {
			out = append(out, e.Name)
		}
	}
	return out
}

// orList is "a", "a or b", "a, b or c".
func orList(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// noStop is the stop function of a strategy that holds nothing.
func noStop() {}

// The settings that only some strategies read, as Check names them: a
// variable, or a variable with the value that counts (FENCING=on set
// explicitly, REDIS_MODE=cluster).
var (
	sqlSettings     = []string{"ADMISSION_LIMIT", "FENCING=on"}
	lockSettings    = []string{"FREEZE_HOLDER", "FENCING=off", "FENCING=on"}
	redisLockExtras = []string{"REDIS_SKIP_POLICY_CHECK"}
	// oneRedis: the strategies that use one Redis, which may be a
	// primary behind Sentinels (RedisClient); not Redlock's independent
	// servers.
	oneRedis        = []string{"REDIS_MODE=sentinel"}
	reserveSettings = slices.Concat([]string{"RESERVE_DURABILITY", "RESERVE_CLAIM_IDLE", "RESERVE_RECONCILE_EVERY", "REDIS_MODE=cluster", "FENCING=on",
		"RESERVE_WAIT_REPLICAS", "RESERVE_WAIT_TIMEOUT"}, oneRedis)
)
