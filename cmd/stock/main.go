// Command stock is the flash-sale service: it takes orders over HTTP and
// deducts stock with the strategy named by STRATEGY, on the database named by
// DATABASE_URL. `stock migrate` applies the schema and exits; `stock
// strategies` lists the valid STRATEGY values.
//
// Configuration is read from the environment; see config.go and docs/configuration.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/flashsale/stock/internal/connlimit"
	"github.com/flashsale/stock/internal/httpapi"
	"github.com/flashsale/stock/internal/jobs"
	"github.com/flashsale/stock/internal/metrics"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		// One line, even when a driver reports each address it tried.
		fmt.Fprintf(os.Stderr, "stock: %s\n", strings.Join(strings.Fields(err.Error()), " "))
		os.Exit(1)
	}
}

// defaultGOGC is the service's garbage collection target when GOGC is not
// set. Its live heap is a few MB, and each order allocates a couple of KB:
// at Go's default of 100 it collected every 1,500 orders or so, and 400
// took 5–12% off the CPU of a sale's 201 and of a sold-out answer
// (scripts/k6-cost.sh, side by side) for a heap of some tens of MB.
const defaultGOGC = 400

func run(args []string) error {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(defaultGOGC)
	}
	if len(args) > 0 && args[0] == "strategies" {
		// For scripts: the valid STRATEGY values, one a line.
		fmt.Println(strings.Join(strategies.Names(), "\n"))
		return nil
	}
	cfg, err := loadConfig(os.Getenv)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	switch {
	case len(args) == 0 || args[0] == "serve":
		return serve(ctx, cfg, log)
	case args[0] == "migrate":
		db, err := openStore(ctx, cfg)
		if err != nil {
			return err
		}
		defer db.Close()
		if err := db.Migrate(ctx); err != nil {
			return err
		}
		log.Info("schema is up to date", "database_url", redactURL(cfg.DatabaseURL))
		return nil
	}
	return fmt.Errorf("unknown command %q: use `stock` (or `stock serve`), `stock migrate` or `stock strategies`", args[0])
}

func openStore(ctx context.Context, cfg config) (store.Store, error) {
	// Fail fast: a database that does not answer within seconds at start is
	// a configuration problem to report, not to wait out.
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// No healthy order sits idle in its transaction or waits on a row lock
	// for longer than the order may take: past that, its client is stuck.
	return store.Open(ctx, cfg.DatabaseURL, cfg.DBMaxConns, store.WithStuckTransactionTimeout(cfg.OrderTimeout))
}

func serve(ctx context.Context, cfg config, log *slog.Logger) error {
	log.Info("starting", cfg.logAttrs()...)
	if entry, _ := strategies.Lookup(cfg.Strategy); !entry.Safe() {
		log.Warn("STRATEGY=" + cfg.Strategy + " OVERSELLS BY DESIGN: " + entry.Invariant + ". " +
			"It is a control that shows what the safe strategies prevent; never use it for a real sale.")
	}
	db, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer db.Close()
	if cfg.Migrate {
		if err := db.Migrate(ctx); err != nil {
			return err
		}
	}
	m := metrics.New()
	sched, closeJobLock, err := newScheduler(ctx, cfg, m, log)
	if err != nil {
		return err
	}
	defer closeJobLock()
	strategy, closeStrategy, err := strategies.Build(ctx, cfg.strategyConfig(), strategies.Deps{DB: db, Metrics: m, Jobs: sched, Log: log})
	if err != nil {
		return err
	}
	defer closeStrategy()
	svc := sales.NewService(db, strategy,
		sales.WithOrderTimeout(cfg.OrderTimeout), sales.WithLogger(log), sales.WithObserver(m),
		sales.WithHoldTTL(cfg.HoldTTL), sales.WithPerUserLimit(int64(cfg.PerUserLimit)),
		sales.WithSoldOutTTL(cfg.SoldOutTTL))
	if cfg.AuditEvery > 0 {
		if err := sched.Add(jobs.AuditJob(cfg.AuditEvery, db, svc, log, m)); err != nil {
			return err
		}
	}
	// The reservation strategies' sweep also relays the returns a process
	// that died left marked (inventory.ReturnRelay).
	if cfg.HoldSweepEvery > 0 {
		if err := sched.Add(jobs.SweepJob(cfg.HoldSweepEvery, svc, log)); err != nil {
			return err
		}
	}
	// The jobs stop before the strategy and the database they use close
	// (deferred earlier, run later).
	jobsCtx, stopJobs := context.WithCancel(context.WithoutCancel(ctx))
	jobsDone := make(chan struct{})
	go func() {
		defer close(jobsDone)
		sched.Run(jobsCtx)
	}()
	defer func() {
		stopJobs()
		<-jobsDone
	}()
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("HTTP_ADDR=%s: %w", cfg.HTTPAddr, err)
	}
	// Connections are capped below the descriptor limit: one client's
	// thousands of idle keep-alive connections once left an instance
	// failing accept4 with EMFILE while buyers waited. At the cap the
	// longest-idle connection makes room; with none idle, only the
	// probes and /metrics are served, in a small headroom.
	conns := connlimit.New(ln, cfg.HTTPMaxConns, connlimit.WithLogger(log), connlimit.WithObserver(m))
	srv := &http.Server{
		Handler: httpapi.New(svc, httpapi.WithAdminToken(cfg.AdminToken), httpapi.WithLogger(log), httpapi.WithMetrics(m.Handler()),
			httpapi.WithOverCap(connlimit.OverCap)),
		// A client that trickles its headers or body is cut off: slow
		// requests must not pin connections and goroutines.
		ReadHeaderTimeout: min(5*time.Second, cfg.ReadTimeout),
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.OrderTimeout + 10*time.Second,
		IdleTimeout:       cfg.HTTPIdleTimeout,
		MaxHeaderBytes:    32 << 10,
		// The cap's bookkeeping: which connections are idle, and which
		// were accepted over the cap.
		ConnState:   conns.ConnState,
		ConnContext: conns.ConnContext,
	}

	served := make(chan error, 1)
	go func() { served <- srv.Serve(conns) }()
	log.Info("listening", "addr", ln.Addr().String(), "max_conns", cfg.HTTPMaxConns)

	select {
	case err := <-served:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down: finishing requests in flight", "timeout", cfg.ShutdownTimeout.String())
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http server: %w", err)
	}
	log.Info("stopped")
	return nil
}
