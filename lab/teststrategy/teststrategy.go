// Package teststrategy builds the registry's strategies for tests, as the
// service builds them (strategies.Build from their entry), with the
// servers each entry Needs started for the test, and judges what their
// buyers were answered: the conformance test and the tests on replicated
// servers (lab/failover) share it.
package teststrategy

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/history"
	"github.com/flashsale/stock/lab/testetcd"
	"github.com/flashsale/stock/lab/testredis"
	"github.com/flashsale/stock/lab/testzk"
)

// Config is e's configuration with the registry's defaults, its lock
// table (db-lock) at databaseURL, and servers started for tb for what it
// Needs: every instance built from it shares them. naive gets a race
// window, so that its oversell is shown, not hoped for; a lock is waited
// for as long as the tests' deadlines allow.
func Config(tb testing.TB, e strategies.Entry, databaseURL string) strategies.Config {
	tb.Helper()
	cfg := strategies.Defaults()
	cfg.Strategy = e.Name
	cfg.NaiveRaceWindow = 20 * time.Millisecond
	cfg.LockWait = 30 * time.Second
	cfg.ReconcileEvery = 0 // the tests audit themselves
	cfg.DatabaseURL = databaseURL
	for _, srv := range e.Needs {
		switch srv {
		case strategies.ServerRedis:
			cfg.RedisAddrs = []string{testredis.Start(tb).Addr}
		case strategies.ServerRedisQuorum:
			cfg.RedisAddrs = nil
			for range 5 {
				cfg.RedisAddrs = append(cfg.RedisAddrs, testredis.Start(tb).Addr)
			}
		case strategies.ServerDurableRedis:
			cfg.RedisAddrs = []string{testredis.StartDurable(tb).Addr}
		case strategies.ServerEtcd:
			cfg.EtcdEndpoints = testetcd.Start(tb).Endpoints()
		case strategies.ServerZooKeeper:
			cfg.ZKServers = []string{testzk.Start(tb).Addr}
		default:
			tb.Fatalf("%s needs %s, which the tests cannot start", e.Name, srv)
		}
	}
	return cfg
}

// Build builds one instance of cfg's strategy over db, stopped when tb
// ends.
func Build(tb testing.TB, cfg strategies.Config, db store.Store) inventory.Strategy {
	tb.Helper()
	s, stop, err := strategies.Build(context.Background(), cfg, strategies.Deps{DB: db, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		tb.Fatalf("build %s: %v", cfg.Strategy, err)
	}
	tb.Cleanup(stop)
	return s
}

// Lookup is the registry's entry of name, or tb fails.
func Lookup(tb testing.TB, name string) strategies.Entry {
	tb.Helper()
	e, ok := strategies.Lookup(name)
	if !ok {
		tb.Fatalf("no strategy %s", name)
	}
	return e
}

// HistoryDir is where a failing history's visualisation goes: HISTORY_DIR
// if set (CI keeps it), else the test's temporary folder.
func HistoryDir(tb testing.TB) string {
	if d := os.Getenv("HISTORY_DIR"); d != "" {
		return d
	}
	return tb.TempDir()
}

// Buyer places orders: a sales.Service, one instance of the service.
type Buyer interface {
	PlaceOrder(ctx context.Context, req inventory.Request) (inventory.Order, error)
}

// Answer is one buyer's order and what it was answered.
type Answer struct {
	Quantity int64
	Order    inventory.Order
	Err      error
}

// Race has buyers goroutines order from one SKU at once, quantities 1 to
// 3, spread over instances in turn, each call, return and outcome
// recorded for the linearizability checker.
func Race(instances []Buyer, sku string, buyers int) ([]Answer, *history.Recorder) {
	rec := history.NewRecorder()
	answers := make([]Answer, buyers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range buyers {
		wg.Go(func() {
			q := int64(i%3 + 1)
			<-start
			done := rec.Begin(i, sku, q)
			o, err := instances[i%len(instances)].PlaceOrder(context.Background(), inventory.Request{SKU: sku, Quantity: q, UserID: fmt.Sprintf("u-%d", i)})
			done(history.OutcomeOf(err))
			answers[i] = Answer{Quantity: q, Order: o, Err: err}
		})
	}
	close(start)
	wg.Wait()
	return answers, rec
}
