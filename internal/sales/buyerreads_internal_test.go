package sales

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestBuyerReadsOfOneSKUShareAStatement: lookups of one SKU that arrive
// while its read is in flight are answered by one read after it, each
// with its own buyer's units, so 300 buyers refused at once cost a few
// reads, not 300; another SKU's lookups never wait for it.
func TestBuyerReadsOfOneSKUShareAStatement(t *testing.T) {
	var reads atomic.Int64
	release := make(chan struct{})
	first := make(chan struct{})
	var once sync.Once
	b := newBuyerReads(func(ctx context.Context, sku string, users []string) (map[string]int64, error) {
		if reads.Add(1) == 1 && sku == "hot" {
			once.Do(func() { close(first) })
			<-release // the first read stays in flight while the others queue
		}
		units := map[string]int64{}
		for _, u := range users {
			var n int64
			if _, err := fmt.Sscanf(u, "u%d", &n); err != nil {
				return nil, err
			}
			units[u] = n % 3
		}
		return units, nil
	})
	var waiting sync.WaitGroup
	b.queued = func(string) { waiting.Done() }
	ctx := context.Background()
	var wg sync.WaitGroup
	check := func(sku string, i int) {
		got, err := b.unitsOf(ctx, sku, fmt.Sprintf("u%d", i))
		if err != nil || got != int64(i%3) {
			t.Errorf("%s u%d: %d, %v; want %d", sku, i, got, err, i%3)
		}
	}
	wg.Go(func() { check("hot", 0) })
	<-first
	waiting.Add(300)
	for i := 1; i <= 300; i++ {
		wg.Go(func() { check("hot", i) })
	}
	waiting.Wait()    // all 300 queued behind the read in flight
	check("other", 7) // not held up by hot's read in flight
	close(release)
	wg.Wait()
	// The first read, the other SKU's, and one for the 300 queued.
	if n := reads.Load(); n != 3 {
		t.Errorf("%d reads for 301 lookups of one SKU and 1 of another; want the queued ones to share", n)
	}
	if len(b.bySKU) != 0 {
		t.Errorf("%d SKUs left with a read in flight after every lookup was answered", len(b.bySKU))
	}
}

// TestBuyerReadsAfterAPanickingReadAnswerTheNextLookup: a read that panics
// (recovered up the stack, as the HTTP server's recovery does for a
// handler) answers its lookups with an error and hands the SKU on, so the
// next lookup runs a read of its own instead of queueing behind one that
// no goroutine runs (found by review).
func TestBuyerReadsAfterAPanickingReadAnswerTheNextLookup(t *testing.T) {
	var calls atomic.Int64
	b := newBuyerReads(func(ctx context.Context, sku string, users []string) (map[string]int64, error) {
		if calls.Add(1) == 1 {
			panic("injected")
		}
		return map[string]int64{users[0]: 1}, nil
	})
	if _, err := b.unitsOf(context.Background(), "s", "u1"); err == nil || !strings.Contains(err.Error(), "panic: injected") {
		t.Errorf("the lookup whose read panicked: %v; want the panic as its error", err)
	}
	if n := len(b.bySKU); n != 0 {
		t.Errorf("%d SKUs left with a read in flight after the panicking read", n)
	}
	if got, err := b.unitsOf(context.Background(), "s", "u2"); err != nil || got != 1 {
		t.Errorf("the next lookup: %d, %v; want its own read's 1", got, err)
	}
}

// TestBuyerLookupGivesUpAtItsDeadline: a lookup queued behind a read that
// does not end (a database that does not answer) gives up at its own
// deadline, so the order's time, which the read shares, bounds it (found
// by review: it waited for the read in flight and then for its own, each
// with a fresh ORDER_TIMEOUT, before the order even began); the next
// lookup of the SKU then runs the read left behind.
func TestBuyerLookupGivesUpAtItsDeadline(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 3)
	var reads atomic.Int64
	b := newBuyerReads(func(ctx context.Context, sku string, users []string) (map[string]int64, error) {
		first := reads.Add(1) == 1
		started <- struct{}{}
		if first {
			<-release // the first read hangs until the test lets it go
		}
		return map[string]int64{}, nil
	})
	queued := make(chan struct{}, 2)
	b.queued = func(string) { queued <- struct{}{} }
	first := make(chan error, 1)
	go func() { _, err := b.unitsOf(context.Background(), "s", "u1"); first <- err }()
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := b.unitsOf(ctx, "s", "u2"); errc <- err }()
	<-queued
	cancel() // u2's deadline passes while u1's read hangs
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("u2 at its deadline: %v; want its context's error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("u2's lookup outlived its context by 10 s, waiting for a read that does not end")
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("u1: %v", err)
	}
	// u2's read was handed on with nobody left to run it: the next
	// lookup joins and runs it.
	if _, err := b.unitsOf(context.Background(), "s", "u3"); err != nil {
		t.Errorf("u3 after u2 gave up: %v", err)
	}
	if n := len(b.bySKU); n != 0 {
		t.Errorf("%d SKUs left with a read in flight", n)
	}
}

// TestBuyerReadsUnderManyLookupsAnswerEachItsOwn: 64 goroutines looking up
// 2,000 buyers each over three SKUs get each its own buyer's units of its
// own SKU, never two reads of one SKU at once, and nothing is left behind.
func TestBuyerReadsUnderManyLookupsAnswerEachItsOwn(t *testing.T) {
	var inflight sync.Map
	b := newBuyerReads(func(ctx context.Context, sku string, users []string) (map[string]int64, error) {
		if _, dup := inflight.LoadOrStore(sku, true); dup {
			return nil, fmt.Errorf("two reads of %s at once", sku)
		}
		defer inflight.Delete(sku)
		m := map[string]int64{}
		for _, u := range users {
			n, _ := strconv.Atoi(u)
			m[u] = int64(n) * int64(len(sku))
		}
		return m, nil
	})
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Go(func() {
			for i := range 2000 {
				sku := []string{"a", "bb", "ccc"}[(g+i)%3]
				u := (g*7919 + i) % 1000
				got, err := b.unitsOf(context.Background(), sku, strconv.Itoa(u))
				if err != nil || got != int64(u*len(sku)) {
					t.Errorf("%s/%d: %d, %v", sku, u, got, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if len(b.bySKU) != 0 {
		t.Errorf("%d SKUs left with a read in flight", len(b.bySKU))
	}
}
