package reservation_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/reservation"
)

// The paged sweep (consumer.go: Run, sweep) under schedules that Redis
// allows: other clients' commands run between the commands of a pipeline,
// and between a consumer's pages. Each test drives its schedule through a
// hook on the sweeping consumer's own client, so the interleaving is exact
// rather than hoped for.

// sweepHook runs a function of the test at chosen points of a consumer's
// commands: beforeScan before each page of the catalog (with its cursor),
// betweenReads between the sweep's two reads of one SKU (its sale and its
// stream, in the pipeline's order), once.
type sweepHook struct {
	sku          string // the SKU whose reads betweenReads splits
	betweenReads func()
	split        atomic.Bool
	beforeScan   func(cursor string)
}

// touches reports whether cmd reads one of sku's keys.
func touches(cmd redis.Cmder, sku string) bool {
	a := cmd.Args()
	if len(a) < 2 {
		return false
	}
	k := fmt.Sprint(a[1])
	return k == "stock:{"+sku+"}:sale" || k == "stock:{"+sku+"}:orders"
}

func (h *sweepHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *sweepHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); h.beforeScan != nil && cmd.Name() == "zscan" && len(args) > 2 && args[1] == catalogKey {
			h.beforeScan(fmt.Sprint(args[2]))
		}
		return next(ctx, cmd)
	}
}

func (h *sweepHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.betweenReads == nil {
			return next(ctx, cmds)
		}
		// Split after the first read of the SKU, if a second one follows
		// in the same pipeline.
		ofSKU := func(c redis.Cmder) bool { return touches(c, h.sku) }
		i := slices.IndexFunc(cmds, ofSKU)
		if i < 0 || !slices.ContainsFunc(cmds[i+1:], ofSKU) || h.split.Swap(true) {
			return next(ctx, cmds)
		}
		// Redis runs other clients' commands between a pipeline's
		// commands: here, between the sweep's two reads of one SKU.
		err := next(ctx, cmds[:i+1])
		h.betweenReads()
		if err2 := next(ctx, cmds[i+1:]); err == nil {
			err = err2
		}
		return err
	}
}

// sweeper runs, until the test ends, a consumer of another instance (one
// that never sold the test's SKUs) on a client with hook h.
func sweeper(t *testing.T, s *sale, h *sweepHook, opts ...reservation.ConsumerOption) {
	t.Helper()
	crdb := redis.NewClient(&redis.Options{Addr: s.redis.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	crdb.AddHook(h)
	t.Cleanup(func() { _ = crdb.Close() })
	c := reservation.New(crdb, s.db).NewConsumer(s.db, append([]reservation.ConsumerOption{reservation.WithConsumerObserver(s.seen)}, opts...)...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// writtenWithin reports whether the consumers wrote n orders within d.
func (s *sale) writtenWithin(n int64, d time.Duration) bool {
	deadline := time.After(d)
	for {
		have, change := s.seen.orders.now()
		if have >= n {
			return true
		}
		select {
		case <-change:
		case <-deadline:
			return false
		}
	}
}

// TestSweepDoesNotRetireAStreamThatGainedAnOrderBetweenItsReads: the sweep
// reads a SKU's sale and its stream in one pipeline, but not atomically,
// and an order may take the last unit between the two reads. When the
// stream was read first, the sweep saw "0 entries" and then "0
// available", and took the SKU off the catalog while its stream held the
// order; had the instance that took it died before its consumer read it,
// no sweep would ever read that stream again (the SKU is sold out, so no
// live instance relists it), and the order, answered 201, would never be
// written. Read sale first, a sold-out sale takes no more orders, and a
// newer sale raises the score before it opens. "new sale" is the same race
// across a restart: a StartSale and its only unit sold between the reads.
func TestSweepDoesNotRetireAStreamThatGainedAnOrderBetweenItsReads(t *testing.T) {
	for _, tc := range []struct {
		name    string
		initial int64 // the sale the sweep finds
		restart bool  // a new sale of one unit is started between the reads
	}{
		{name: "last unit", initial: 1},
		{name: "new sale", initial: 0, restart: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSale(t, "postgres") // instance A: takes the order, dies before its consumer reads it
			const sku = "last-unit"
			s.start(sku, tc.initial)
			var orderErr error
			h := &sweepHook{sku: sku, betweenReads: func() {
				if tc.restart {
					if orderErr = s.svc.StartSale(context.Background(), sku, 1); orderErr != nil {
						return
					}
				}
				_, orderErr = s.order(sku, 1, "buyer", "")
			}}
			sweeper(t, s, h, reservation.WithSweep(20*time.Millisecond))

			if s.writtenWithin(1, 3*time.Second) {
				return
			}
			if !h.split.Load() || orderErr != nil {
				t.Fatalf("the schedule did not happen: split %v, order %v", h.split.Load(), orderErr)
			}
			ctx := context.Background()
			_, zerr := s.rdb.ZScore(ctx, catalogKey, sku).Result()
			n, _ := s.rdb.XLen(ctx, "stock:{"+sku+"}:orders").Result()
			t.Fatalf("an order answered 201 was not written in 3 s of sweeps every 20 ms: its stream holds %d entries, and the SKU is listed: %v (ZSCORE err %v)",
				n, !errors.Is(zerr, redis.Nil), zerr)
		})
	}
}

// TestSweepCursorDoesNotSkipAStreamEveryWalk: a walk of the catalog reads
// every SKU listed for the whole walk, whatever joins, leaves or moves
// meanwhile. The walk was an index into a set ordered by score: a SKU
// leaving the part before the index between two pages (a new sale of it,
// Close's ZADD GT, moves it behind; a retire by another consumer) moved
// every SKU after it down by one, and the first SKU of the next page went
// unread; repeated at the same point of every walk, an orphaned stream was
// skipped by every walk. Here a shop opens one new SKU as each walk
// begins and starts it again at the walk's next page, while 300 listed
// SKUs without a sale keep the catalog large enough to be read in pages.
func TestSweepCursorDoesNotSkipAStreamEveryWalk(t *testing.T) {
	s := newSale(t, "postgres") // instance A: takes the orders, dies before its consumer reads them
	ctx := context.Background()
	fillers := make([]redis.Z, 300)
	for i := range fillers {
		fillers[i] = redis.Z{Score: 1, Member: fmt.Sprintf("filler-%03d", i)}
	}
	if err := s.rdb.ZAdd(ctx, catalogKey, fillers...).Err(); err != nil {
		t.Fatal(err)
	}
	const orphan = "m-orphan"
	s.start(orphan, 5)
	for i := range 2 {
		if _, err := s.order(orphan, 1, fmt.Sprintf("u%d", i), ""); err != nil {
			t.Fatal(err)
		}
	}

	const walks = 8
	var (
		mu       sync.Mutex
		walk     int // walks begun
		moved    bool
		meddling = true
		errs     []error
	)
	h := &sweepHook{beforeScan: func(cursor string) {
		mu.Lock()
		defer mu.Unlock()
		if !meddling {
			return
		}
		switch {
		case cursor == "0": // a walk begins: a new SKU goes on sale
			if walk == walks {
				meddling = false
				return
			}
			walk++
			moved = false
			if err := s.svc.StartSale(context.Background(), fmt.Sprintf("a-%03d", walk), 1); err != nil {
				errs = append(errs, err)
			}
		case !moved: // the walk's next page: the new SKU is started again
			moved = true
			if err := s.svc.StartSale(context.Background(), fmt.Sprintf("a-%03d", walk), 1); err != nil {
				errs = append(errs, err)
			}
		}
	}}
	sweeper(t, s, h, reservation.WithSweep(10*time.Millisecond), reservation.WithSweepPage(16))

	deadline := time.After(60 * time.Second)
	for {
		have, change := s.seen.orders.now()
		mu.Lock()
		w, m, e := walk, meddling, errs
		mu.Unlock()
		if len(e) > 0 {
			t.Fatal(e)
		}
		if have >= 2 {
			if m {
				return // found during the schedule
			}
			t.Fatalf("the orphan's 2 orders were written only after the schedule stopped: %d walks of the catalog, each with a new SKU started and started again, skipped the orphaned stream", w)
		}
		select {
		case <-change:
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			t.Fatalf("the orphan's orders were not written in 60 s (%d walks)", w)
		}
	}
}
