package reservation_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/redisconn"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testdb"
	"github.com/flashsale/stock/lab/testredis"
)

// BenchmarkReserve: buyers concurrent goroutines place one-unit orders on
// one SKU through one service (no HTTP), with redis-reserve and redis-watch
// (a durable private redis-server, appendfsync always, and one consumer
// writing into a pool of 16 connections; redis-watch with CAS_MAX_ATTEMPTS
// 50 and CAS_MAX_IN_FLIGHT 2, as the service runs it) and, beside them in
// the same run, conditional as the service runs it (ROW_MAX_IN_FLIGHT=4).
// The stock never runs out. orders/s is the rate of answers; for the Redis
// strategies written/s is the rate at which the database had every order
// (from the first order to the last row), and lag-p99-ms the 99th
// percentile from an order's acceptance to its commit.
//
//	go test -run '^$' -bench Reserve -benchtime 20000x -count 3 ./internal/reservation/ | tee testdata/bench-reserve.txt
//	benchstat -col /... testdata/bench-reserve.txt (see testdata/bench-reserve-benchstat.txt)
func BenchmarkReserve(b *testing.B) {
	// redis-reserve runs as the service runs it (4 pipelines) and with
	// every order's script sent on its own (pipelines=0).
	type variant struct {
		name      string
		pipelines int
		label     string
	}
	variants := []variant{
		{strategies.NameRedisReserve, 4, strategies.NameRedisReserve},
		{strategies.NameRedisReserve, 0, strategies.NameRedisReserve + "/pipelines=0"},
		{strategies.NameRedisWatch, 0, strategies.NameRedisWatch},
		{strategies.NameConditional, 0, strategies.NameConditional},
	}
	for _, engine := range store.Engines {
		for _, v := range variants {
			for _, buyers := range []int{1, 16, 64, 256} {
				b.Run(fmt.Sprintf("%s/%s/buyers=%d", engine, v.label, buyers), func(b *testing.B) {
					benchOrders(b, engine, v.name, v.pipelines, buyers)
				})
			}
		}
	}
}

// BenchmarkReserveReplicated: what waiting for the replicas costs. The
// burst of BenchmarkReserve (PostgreSQL, redis-reserve as the service runs
// it and redis-watch) on one durable Redis, and beside it on a primary with
// two replicas and three Sentinels (lab/testredis.StartReplicated) reached
// as REDIS_MODE=sentinel does, each order waiting for every online replica
// (RESERVE_WAIT_REPLICAS=1, the default there).
//
//	go test -run '^$' -bench 'ReserveReplicated/redis-reserve' -benchtime 20000x -count 3 ./internal/reservation/
//
// (testdata/bench-reserve-replicated.txt; go-redis logs each Sentinel's
// answer on the benchmark's line, which the file leaves out).
func BenchmarkReserveReplicated(b *testing.B) {
	for _, v := range []struct {
		name      string
		pipelines int
	}{{strategies.NameRedisReserve, 4}, {strategies.NameRedisWatch, 0}} {
		for _, buyers := range []int{64, 256} {
			for _, replicated := range []bool{false, true} {
				b.Run(fmt.Sprintf("%s/replicated=%v/buyers=%d", v.name, replicated, buyers), func(b *testing.B) {
					benchOrdersOn(b, "postgres", v.name, v.pipelines, buyers, replicated)
				})
			}
		}
	}
}

func benchOrders(b *testing.B, engine, name string, pipelines, buyers int) {
	benchOrdersOn(b, engine, name, pipelines, buyers, false)
}

// benchOrdersOn is benchOrders, on a replicated Redis behind Sentinels
// when replicated.
func benchOrdersOn(b *testing.B, engine, name string, pipelines, buyers int, replicated bool) {
	ctx := context.Background()
	db := testdb.New(b, engine, 16)
	gated, err := sqlrow.LimitRowWork(sqlrow.NewConditional(), 4)
	if err != nil {
		b.Fatal(err)
	}
	var strategy inventory.Strategic = gated
	seen := &lags{}
	reserved := name != strategies.NameConditional
	if reserved {
		var rdb redis.UniversalClient
		opts := []reservation.Option{reservation.WithPipelines(pipelines)}
		if replicated {
			o := redisconn.FailoverOptions(testredis.MasterName, testredis.StartReplicated(b, testredis.SentinelOptions{}).Addrs())
			o.PoolSize = 64
			rdb = redis.NewFailoverClient(o)
			opts = append(opts, reservation.WithReplicas(1, 500*time.Millisecond))
		} else {
			rdb = redis.NewClient(&redis.Options{Addr: testredis.StartDurable(b).Addr, MaxRetries: -1, PoolSize: 64})
		}
		b.Cleanup(func() { _ = rdb.Close() })
		if name == strategies.NameRedisWatch {
			opts = append(opts, reservation.WithOptimisticTransactions(50, 2))
		}
		res := reservation.New(rdb, db, opts...)
		consumer := res.NewConsumer(db, reservation.WithConsumerObserver(seen))
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = consumer.Run(runCtx) }()
		b.Cleanup(func() { cancel(); <-done })
		strategy = reservation.NewReserved(res, db, reservation.WithReservedName(name))
	}
	svc := sales.NewService(db, strategy, sales.WithOrderTimeout(30*time.Second))
	if err := svc.StartSale(ctx, "hot", inventory.MaxInitialStock); err != nil {
		b.Fatal(err)
	}
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	began := time.Now()
	for range buyers {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
				if _, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "hot", Quantity: 1, UserID: fmt.Sprint("u-", i)}); err != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	answered := time.Since(began)
	if reserved {
		seen.waitFor(b, int64(b.N))
	}
	written := time.Since(began)
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Errorf("%d of %d orders failed", n, b.N)
	}
	b.ReportMetric(float64(b.N)/answered.Seconds(), "orders/s")
	if reserved {
		b.ReportMetric(float64(b.N)/written.Seconds(), "written/s")
		b.ReportMetric(float64(seen.p99().Microseconds())/1000, "lag-p99-ms")
	}
}

// lags records every order's time from acceptance to commit.
type lags struct {
	mu     sync.Mutex
	all    []time.Duration
	change chan struct{}
}

func (l *lags) Written(_ string, ls []time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = append(l.all, ls...)
	if l.change != nil {
		close(l.change)
		l.change = nil
	}
}

func (l *lags) Failed(string) {}

func (l *lags) waitFor(b *testing.B, n int64) {
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		have := int64(len(l.all))
		if l.change == nil {
			l.change = make(chan struct{})
		}
		change := l.change
		l.mu.Unlock()
		if have >= n {
			return
		}
		select {
		case <-change:
		case <-deadline.C:
			b.Fatalf("the consumer wrote %d of %d orders in a minute", have, n)
		}
	}
}

func (l *lags) p99() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.all) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), l.all...)
	slices.Sort(s)
	return s[len(s)*99/100]
}

// BenchmarkReserveCluster: 256 goroutines place one-unit orders round robin
// on 64 SKUs through one service (no HTTP; redis-reserve, one consumer
// writing into PostgreSQL) on a Redis Cluster of one master and of three
// masters, side by side. A SKU lives on one master: more masters carry more
// SKUs, never one SKU faster. orders/s is the rate of answers.
//
//	go test -run '^$' -bench ReserveCluster -benchtime 40000x -count 3 ./internal/reservation/
func BenchmarkReserveCluster(b *testing.B) {
	for _, masters := range []int{1, 3} {
		b.Run(fmt.Sprintf("masters=%d", masters), func(b *testing.B) {
			ctx := context.Background()
			cluster := testredis.StartCluster(b, masters)
			cc := cluster.Client(b)
			db := testdb.New(b, "postgres", 16)
			res := reservation.New(cc, db)
			runCtx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { defer close(done); _ = res.NewConsumer(db).Run(runCtx) }()
			b.Cleanup(func() { cancel(); <-done })
			svc := sales.NewService(db, reservation.NewReserved(res, db), sales.WithOrderTimeout(30*time.Second))
			const skus = 64
			for i := range skus {
				if err := svc.StartSale(ctx, fmt.Sprintf("s-%d", i), inventory.MaxInitialStock); err != nil {
					b.Fatal(err)
				}
			}
			var next, failed atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			began := time.Now()
			for range 256 {
				wg.Go(func() {
					for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
						sku := fmt.Sprintf("s-%d", i%skus)
						if _, err := svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: fmt.Sprint("u-", i)}); err != nil {
							failed.Add(1)
						}
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(began)
			b.StopTimer()
			if n := failed.Load(); n > 0 {
				b.Errorf("%d of %d orders failed", n, b.N)
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "orders/s")
		})
	}
}
