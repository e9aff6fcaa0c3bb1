package strategies

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/flashsale/stock/internal/locking/dblock"
	"github.com/flashsale/stock/internal/locking/etcdlock"
	"github.com/flashsale/stock/internal/locking/inventorylock"
	"github.com/flashsale/stock/internal/locking/zklock"
)

// etcdBackend connects to the etcd cluster of ETCD_ENDPOINTS. The
// session's lease has LOCK_TTL (whole seconds); LOCK_WAIT bounds a wait.
func etcdBackend(cfg Config, renewed func(ok bool), _ *slog.Logger) (lockBackend, error) {
	client, err := clientv3.New(clientv3.Config{
		Endpoints:   cfg.EtcdEndpoints,
		DialTimeout: 2 * time.Second,
		// The client's own log goes nowhere: the lock reports what matters
		// through its errors and the renewal observer.
		Logger: zap.NewNop(),
	})
	if err != nil {
		return lockBackend{}, fmt.Errorf("etcd %v: %w", cfg.EtcdEndpoints, err)
	}
	ping := func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		// A linearizable read needs a leader: a cluster that lost its
		// quorum is not ready to sell.
		if _, err := client.Get(ctx, "health"); err != nil {
			return fmt.Errorf("etcd %v: %w", cfg.EtcdEndpoints, err)
		}
		return nil
	}
	if err := ping(context.Background()); err != nil {
		_ = client.Close()
		return lockBackend{}, fmt.Errorf("cannot reach etcd (ETCD_ENDPOINTS): %w", err)
	}
	l := etcdlock.New(client, etcdlock.WithTTL(cfg.LockTTL), etcdlock.WithWait(cfg.LockWait),
		etcdlock.WithRenewalObserver(func(err error) { renewed(err == nil) }))
	return lockBackend{
		locker: inventorylock.Adapt(l),
		ping:   ping,
		close: func() {
			_ = l.Close()
			_ = client.Close()
		},
	}, nil
}

// zkBackend connects to the ZooKeeper ensemble of ZK_SERVERS with a
// session of LOCK_TTL; LOCK_WAIT bounds a wait.
func zkBackend(cfg Config, _ func(ok bool), _ *slog.Logger) (lockBackend, error) {
	l, err := zklock.New(cfg.ZKServers, zklock.WithSessionTimeout(cfg.LockTTL), zklock.WithWait(cfg.LockWait),
		// The client logs every reconnection; the lock reports what matters
		// through its errors and the leases' contexts.
		zklock.WithLogger(zklock.Quiet()))
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), max(2*time.Second, cfg.LockTTL))
		err = l.Ping(ctx)
		cancel()
		if err != nil {
			_ = l.Close()
		}
	}
	if err != nil {
		return lockBackend{}, fmt.Errorf("cannot reach ZooKeeper (ZK_SERVERS %v): %w", cfg.ZKServers, err)
	}
	return lockBackend{
		locker: inventorylock.Adapt(l),
		ping: func(ctx context.Context) error {
			if err := l.Ping(ctx); err != nil {
				return fmt.Errorf("zookeeper %v: %w", cfg.ZKServers, err)
			}
			return nil
		},
		close: func() { _ = l.Close() },
	}, nil
}

// dbBackend opens the lock table in the service's own database
// (DATABASE_URL), on a small pool of its own: LOCK_TTL is the lease,
// LOCK_RENEW_EVERY the heartbeat (default a third of it), LOCK_WAIT bounds
// a wait.
func dbBackend(cfg Config, renewed func(ok bool), _ *slog.Logger) (lockBackend, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	opts := []dblock.Option{dblock.WithTTL(cfg.LockTTL), dblock.WithWait(cfg.LockWait),
		dblock.WithRenewalObserver(func(err error) { renewed(err == nil) })}
	if cfg.LockRenewEvery > 0 {
		opts = append(opts, dblock.WithRenewEvery(cfg.LockRenewEvery))
	}
	l, err := dblock.Open(ctx, cfg.DatabaseURL, opts...)
	if err == nil {
		if err = l.Ping(ctx); err != nil {
			_ = l.Close()
		}
	}
	if err != nil {
		return lockBackend{}, fmt.Errorf("cannot use the lock table (DATABASE_URL; the migrations create it): %w", err)
	}
	return lockBackend{
		locker: inventorylock.Adapt(l),
		ping:   l.Ping,
		close:  func() { _ = l.Close() },
	}, nil
}
