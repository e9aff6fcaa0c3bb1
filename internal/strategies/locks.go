package strategies

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/locked"
	"github.com/flashsale/stock/internal/locking/getsetlock"
	"github.com/flashsale/stock/internal/locking/inventorylock"
	"github.com/flashsale/stock/internal/locking/redislock"
	"github.com/flashsale/stock/internal/redisconn"
)

// lockBackend is one lock service as the service uses it: the domain's
// Locker, a readiness check, and what to close at shutdown.
type lockBackend struct {
	locker locked.Locker
	ping   func(context.Context) error
	close  func()
}

// connect connects to a lock service from the configuration; renewed hears
// about the renewals of the lock (the watchdog's, the etcd session's).
type connect func(cfg Config, renewed func(ok bool), log *slog.Logger) (lockBackend, error)

// lockEntry is the entry of a lock strategy over the backend connect
// reaches: the plain read-check-write under the lock, the write fenced
// (FENCING=off only to demonstrate what fencing prevents). check, when not
// nil, refuses what the backend cannot run with.
func lockEntry(info Info, connect connect, check func(Config) error) Entry {
	return Entry{Info: info, Settings: lockSettings, Check: check, Build: func(_ context.Context, cfg Config, deps Deps) (inventory.Strategy, func(), error) {
		backend, err := connect(cfg, deps.Metrics.Renewed, deps.Log)
		if err != nil {
			return inventory.Strategy{}, nil, err
		}
		if !cfg.Fencing {
			deps.Log.Warn("FENCING=off: a lock holder that was paused past its lock's TTL can still write and oversell. " +
				"This setting exists only to demonstrate what fencing prevents.")
		}
		return lockedOver(cfg, deps, backend, cfg.Fencing), backend.close, nil
	}}
}

// lockedOver is the lock strategy cfg.Strategy over backend. The database
// answers whether a SKU exists before its lock is taken; the metrics hear
// about lock waits and holds.
func lockedOver(cfg Config, deps Deps, backend lockBackend, fencing bool) inventory.Strategy {
	lockOpts := []locked.Option{
		locked.WithFencing(fencing),
		locked.WithObserver(deps.Metrics),
		locked.WithSKULookup(func(ctx context.Context, sku string) error {
			_, err := deps.DB.Level(ctx, sku)
			return err
		}),
		locked.WithPing(backend.ping),
	}
	if cfg.FreezeHolder {
		deps.Log.Warn("FREEZE_HOLDER=true: the first order will stop this whole process (SIGSTOP) between its read and its write; "+
			"resume it with kill -CONT", "pid", os.Getpid())
		lockOpts = append(lockOpts, locked.WithFreezeAfterRead(func() { freezeSelf(deps.Log) }))
	}
	return locked.New(cfg.Strategy, backend.locker, lockOpts...).Strategy()
}

// redisLockEntry is redis-lock's entry (the first of REDIS_ADDRS), or with
// quorum Redlock's (all of them: an odd number of at least 3 independent
// servers).
func redisLockEntry(info Info, quorum bool) Entry {
	var check func(Config) error
	if quorum {
		check = func(cfg Config) error {
			if n := len(cfg.RedisAddrs); n < 3 || n%2 == 0 {
				return fmt.Errorf("STRATEGY=%s needs an odd number of at least 3 independent servers in REDIS_ADDRS, got %d", cfg.Strategy, n)
			}
			return nil
		}
	}
	e := lockEntry(info, func(cfg Config, renewed func(ok bool), log *slog.Logger) (lockBackend, error) {
		return redisBackend(cfg, quorum, renewed, log)
	}, check)
	e.Settings = append(slices.Clone(e.Settings), redisLockExtras...)
	if !quorum {
		e.Settings = append(e.Settings, oneRedis...)
	}
	return e
}

// checkEtcdTTL refuses a LOCK_TTL below etcd's smallest lease TTL.
func checkEtcdTTL(cfg Config) error {
	if cfg.LockTTL < time.Second {
		return fmt.Errorf("LOCK_TTL=%s is below etcd's smallest lease TTL, 1s", cfg.LockTTL)
	}
	return nil
}

// legacyEntry is the control lock: SETNX + GETSET on the first Redis, with
// no token to fence with (its writes are never fenced: what it is here to
// show).
func legacyEntry(info Info) Entry {
	return Entry{Info: info, Settings: slices.Concat([]string{"FREEZE_HOLDER", "FENCING=off"}, redisLockExtras, oneRedis), Build: func(_ context.Context, cfg Config, deps Deps) (inventory.Strategy, func(), error) {
		backend, err := legacyBackend(cfg, deps.Log)
		if err != nil {
			return inventory.Strategy{}, nil, err
		}
		return lockedOver(cfg, deps, backend, false), backend.close, nil
	}}
}

// redisBackend connects to the Redis servers of REDIS_ADDRS: the first, or
// with quorum all of them (Redlock).
func redisBackend(cfg Config, quorum bool, renewed func(ok bool), log *slog.Logger) (lockBackend, error) {
	addrs := cfg.RedisAddrs
	if !quorum {
		addrs = addrs[:1]
	}
	clients := make([]*redis.Client, len(addrs))
	for i, addr := range addrs {
		// A down node fails fast (redisOptions): no retried commands,
		// one dial per attempt.
		tuning := RedisTuning{ReadTimeout: time.Second, WriteTimeout: time.Second}
		if quorum {
			opt := redisconn.Options(addr)
			opt.ReadTimeout, opt.WriteTimeout = tuning.ReadTimeout, tuning.WriteTimeout
			clients[i] = redis.NewClient(opt)
		} else {
			clients[i], _ = RedisClient(cfg, tuning)
		}
	}
	closeClients := func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}
	majority := quorum
	if err := pingRedis(context.Background(), clients, majority); err != nil {
		closeClients()
		return lockBackend{}, err
	}
	if err := checkEvictionPolicy(context.Background(), clients, cfg.SkipPolicyCheck, log); err != nil {
		closeClients()
		return lockBackend{}, err
	}
	opts := []redislock.Option{redislock.WithTTL(cfg.LockTTL), redislock.WithWait(cfg.LockWait),
		redislock.WithRenewalObserver(func(_ string, err error) { renewed(err == nil) })}
	if cfg.LockRenewEvery > 0 {
		if cfg.LockRenewEvery >= cfg.LockTTL {
			log.Warn("LOCK_RENEW_EVERY is not shorter than LOCK_TTL: locks will expire between renewals. Use it only to demonstrate fencing.")
		}
		opts = append(opts, redislock.WithRenewEvery(cfg.LockRenewEvery))
	}
	var locker locked.Locker
	var closeLocker func() error
	if !quorum {
		l := redislock.New(clients[0], opts...)
		locker, closeLocker = inventorylock.Adapt(l), l.Close
	} else {
		l, err := redislock.NewRedlock(clients, opts...)
		if err != nil {
			closeClients()
			return lockBackend{}, err
		}
		locker, closeLocker = inventorylock.Adapt(l), l.Close
	}
	return lockBackend{
		locker: locker,
		ping:   func(ctx context.Context) error { return pingRedis(ctx, clients, majority) },
		close: func() {
			_ = closeLocker()
			closeClients()
		},
	}, nil
}

// pingRedis checks the servers: all of them, or with majority set, more than
// half (Redlock works with a minority down).
func pingRedis(ctx context.Context, clients []*redis.Client, majority bool) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	errs := make([]error, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Ping(ctx).Err(); err != nil {
				errs[i] = fmt.Errorf("redis %s: %w", c.Options().Addr, err)
			}
		}()
	}
	wg.Wait()
	var failed []error
	for _, err := range errs {
		if err != nil {
			failed = append(failed, err)
		}
	}
	if len(failed) == 0 || (majority && len(failed) < len(clients)/2+1) {
		return nil
	}
	return fmt.Errorf("cannot reach Redis: %w", errors.Join(failed...))
}

// errEvictingRedis: a Redis server the locks use may evict keys, or its
// policy could not be read.
var errEvictingRedis = errors.New("the locks need Redis with maxmemory-policy noeviction")

// checkEvictionPolicy refuses Redis servers that may evict keys. A fencing
// counter (K:fence, no TTL) evicted under memory pressure starts the tokens
// again from 1, below the fence the database kept, so fencing breaks (and an
// evicted lock key lets a second holder in). Every server that answers is
// asked (CONFIG GET maxmemory-policy); any policy but noeviction is refused.
// A server whose CONFIG is disabled or renamed (or denied by an ACL) is
// refused too, unless skipUnreadable (REDIS_SKIP_POLICY_CHECK): the operator
// checked it. A server that does not answer is pingRedis's business (Redlock
// starts with a minority down); it is not checked when it comes back.
func checkEvictionPolicy(ctx context.Context, clients []*redis.Client, skipUnreadable bool, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	evicting := make([]error, len(clients))
	unreadable := make([]error, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			addr := c.Options().Addr
			v, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
			var reply redis.Error
			switch {
			case errors.As(err, &reply):
				unreadable[i] = fmt.Errorf("redis %s: cannot read maxmemory-policy: CONFIG GET: %w", addr, err)
			case err != nil:
				// Unreachable now: pingRedis has decided whether that is fine.
			case v["maxmemory-policy"] != "noeviction":
				evicting[i] = fmt.Errorf("redis %s: maxmemory-policy is %s", addr, v["maxmemory-policy"])
			}
		})
	}
	wg.Wait()
	if errs := compactErrors(evicting); len(errs) > 0 {
		return fmt.Errorf("%w: %w; an evicted fencing counter starts the tokens again and breaks fencing: "+
			"run them with --maxmemory-policy noeviction (redis.conf, or CONFIG SET)", errEvictingRedis, errors.Join(errs...))
	}
	if errs := compactErrors(unreadable); len(errs) > 0 {
		if !skipUnreadable {
			return fmt.Errorf("%w: %w; CONFIG may be disabled or renamed: make sure they run with maxmemory-policy noeviction, "+
				"then set REDIS_SKIP_POLICY_CHECK=1 to start without this check", errEvictingRedis, errors.Join(errs...))
		}
		log.Warn("REDIS_SKIP_POLICY_CHECK=1: starting although the Redis eviction policy could not be read; "+
			"it must be noeviction, or an evicted fencing counter breaks fencing", "err", errors.Join(errs...))
	}
	return nil
}

func compactErrors(errs []error) []error {
	var out []error
	for _, err := range errs {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// freezeSelf stops this process with SIGSTOP and returns once it has been
// continued. A signal sent to oneself is delivered asynchronously — the
// caller would run on for a moment, long enough to send its write — so it
// waits for the SIGCONT that ends the stop.
func freezeSelf(log *slog.Logger) {
	continued := make(chan os.Signal, 1)
	signal.Notify(continued, syscall.SIGCONT)
	defer signal.Stop(continued)
	log.Warn("freezing: SIGSTOP to self while holding the lock", "pid", os.Getpid())
	if err := syscall.Kill(os.Getpid(), syscall.SIGSTOP); err != nil {
		log.Error("freeze failed", "err", err)
		return
	}
	<-continued
	log.Warn("continued after the freeze")
}

// legacyBackend connects the SETNX + GETSET control lock to the first
// Redis of REDIS_ADDRS. It refuses an evicting Redis as the other Redis
// locks do, though nothing it keeps could save it.
func legacyBackend(cfg Config, log *slog.Logger) (lockBackend, error) {
	client, _ := RedisClient(cfg, RedisTuning{})
	if err := pingRedis(context.Background(), []*redis.Client{client}, false); err != nil {
		_ = client.Close()
		return lockBackend{}, err
	}
	if err := checkEvictionPolicy(context.Background(), []*redis.Client{client}, cfg.SkipPolicyCheck, log); err != nil {
		_ = client.Close()
		return lockBackend{}, err
	}
	locker := getsetlock.New(client, getsetlock.WithTTL(cfg.LockTTL), getsetlock.WithWait(cfg.LockWait))
	return lockBackend{
		locker: inventorylock.Adapt(locker),
		ping:   func(ctx context.Context) error { return client.Ping(ctx).Err() },
		close:  func() { _ = client.Close() },
	}, nil
}
