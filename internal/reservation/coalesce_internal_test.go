package reservation

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/lab/testredis"
)

// The coalescer's tests run the reserve script on a SKU that was never
// loaded: every run answers {"unloaded"} and changes nothing, and Redis's
// own count of EVALSHA calls says how many scripts reached it.

func unloadedKeys(c *coalescer) []string {
	s := New(c.rdb, nil)
	k := s.keys(testSKU)
	return []string{k.sale, k.idem, k.orders, s.placedKey(testSKU, "o")}
}

var unloadedArgs = []any{"o", 1, "u", "", "", 60000, "redis-reserve"}

func evalshaCalls(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:calls="); ok {
			n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	return 0
}

// idle checks that the coalescer is back at rest: nothing queued, nobody
// leading. A lead lost on the way would leave leaders above 0 for ever, and
// once at max every later order would wait for nobody.
func idle(t *testing.T, c *coalescer) {
	t.Helper()
	if msg := restState(c); msg != "" {
		t.Fatal(msg)
	}
}

func restState(c *coalescer) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for sku, ln := range c.lines {
		return fmt.Sprintf("coalescer not at rest: SKU %q has %d queued, %d leading", sku, len(ln.queue), ln.leaders)
	}
	return ""
}

// testSKU is the SKU of the tests that use one line.
const testSKU = "never-loaded"

// lineOf returns sku's line, creating it if the coalescer has none (a
// line at rest is removed): call it under c.mu.
func lineOf(c *coalescer, sku string) *line {
	ln := c.lines[sku]
	if ln == nil {
		ln = &line{}
		c.lines[sku] = ln
	}
	return ln
}

// queued and leading read testSKU's line: call them under c.mu (waitFor's
// conditions run there).
func queued(c *coalescer) int  { return len(lineOf(c, testSKU).queue) }
func leading(c *coalescer) int { return lineOf(c, testSKU).leaders }

// playLeaders makes the test n leaders of testSKU's line, as if n
// pipelines were out; endTurn ends one of them.
func playLeaders(c *coalescer, n int) {
	c.mu.Lock()
	lineOf(c, testSKU).leaders += n
	c.mu.Unlock()
}

func endTurn(c *coalescer) {
	c.mu.Lock()
	c.handOnLocked(testSKU, lineOf(c, testSKU))
	c.mu.Unlock()
}

func newTestCoalescer(t *testing.T, pipelines int) (*coalescer, *redis.Client, *testredis.Server) {
	srv := testredis.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true, ReadTimeout: 30 * time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	if err := reserveScript.Load(context.Background(), rdb).Err(); err != nil {
		t.Fatal(err)
	}
	c := newCoalescer(rdb, pipelines, &Store{})
	c.changed = make(chan struct{}, 1)
	return c, rdb, srv
}

// Orders whose deadline ends while every pipeline is out are never sent
// (errNotSent: they took nothing), and the queued order behind them is
// still sent once the pipelines return: leaving does not lose the lead.
func TestCoalescerDropsOrdersThatLeaveBeforeTheyAreSent(t *testing.T) {
	c, rdb, srv := newTestCoalescer(t, 2)
	keys := unloadedKeys(c)
	before := evalshaCalls(t, rdb)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Resume() }()

	// Two leaders, each with its pipeline out to the paused server.
	var out sync.WaitGroup
	results := make(chan error, 3)
	for leaders := 1; leaders <= 2; leaders++ {
		out.Go(func() {
			reply, err := c.run(context.Background(), testSKU, keys, unloadedArgs)
			if err == nil && (len(reply) != 1 || reply[0] != "unloaded") {
				err = fmt.Errorf("reply %q", reply)
			}
			results <- err
		})
		waitFor(t, c, func() bool { return leading(c) == leaders && queued(c) == 0 })
	}

	// Orders queued behind them give up; the first of them had been next.
	for i := range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		leaving := make(chan error, 1)
		go func() { _, err := c.run(ctx, testSKU, keys, unloadedArgs); leaving <- err }()
		waitFor(t, c, func() bool { return queued(c) == 1 })
		cancel()
		if err := <-leaving; !errors.Is(err, errNotSent) {
			t.Fatalf("queued order %d that left: %v, want errNotSent", i, err)
		}
	}
	// One that stays, queued behind the two pipelines.
	out.Go(func() {
		_, err := c.run(context.Background(), testSKU, keys, unloadedArgs)
		results <- err
	})
	waitFor(t, c, func() bool { return queued(c) == 1 })
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	out.Wait()
	close(results)
	for err := range results {
		if err != nil {
			t.Fatal(err)
		}
	}
	idle(t, c)
	if got := evalshaCalls(t, rdb) - before; got != 3 {
		t.Fatalf("%d scripts reached Redis, want 3 (the 20 that left must not)", got)
	}
}

// Many orders at once, a third of them leaving at a random moment: every
// one that stays gets its answer, nobody waits for a lead that was lost,
// and the coalescer ends at rest.
func TestCoalescerKeepsItsLeadWhileOrdersComeAndGo(t *testing.T) {
	c, rdb, _ := newTestCoalescer(t, 3)
	keys := unloadedKeys(c)
	before := evalshaCalls(t, rdb)
	const orders = 3000
	var wg sync.WaitGroup
	var mu sync.Mutex
	answered, notSent := 0, 0
	for i := range orders {
		wg.Go(func() {
			ctx := context.Background()
			if i%3 == 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Duration(rand.IntN(2000))*time.Microsecond)
				defer cancel()
			}
			reply, err := c.run(ctx, testSKU, keys, unloadedArgs)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil && len(reply) == 1 && reply[0] == "unloaded":
				answered++
			case err == nil:
				t.Errorf("order %d: reply %q", i, reply)
			case errors.Is(err, errNotSent):
				notSent++
			case i%3 == 0 && pastDeadline(ctx):
				// Sent, and its deadline came before its answer (the
				// context's error, or the pipeline's own timeout when
				// every order in it had a deadline).
			default:
				t.Errorf("order %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	idle(t, c)
	if answered < orders*2/3 {
		t.Fatalf("%d orders answered, want at least the %d that never left", answered, orders*2/3)
	}
	sent := evalshaCalls(t, rdb) - before
	if sent > orders-notSent || sent < answered {
		t.Fatalf("%d scripts reached Redis; %d answered, %d never sent of %d", sent, answered, notSent, orders)
	}
	if _, err := c.run(context.Background(), testSKU, keys, unloadedArgs); err != nil {
		t.Fatal(err)
	}
	idle(t, c)
	t.Logf("%d answered, %d left before they were sent, %d scripts sent", answered, notSent, sent)
}

// A queued order told to lead (the pipeline before it returned) that
// leaves at the same moment passes the lead on. The test plays the leader
// whose turn ends; the order sees its deadline and the lead together, in
// either order, over many rounds.
func TestCoalescerLeadPassesOnFromAnOrderThatLeaves(t *testing.T) {
	c, _, _ := newTestCoalescer(t, 1)
	keys := unloadedKeys(c)
	for round := range 200 {
		playLeaders(c, 1)
		ctx, cancel := context.WithCancel(context.Background())
		left := make(chan error, 1)
		go func() { _, err := c.run(ctx, testSKU, keys, unloadedArgs); left <- err }()
		waitFor(t, c, func() bool { return queued(c) == 1 })
		c.mu.Lock()
		cancel()
		c.handOnLocked(testSKU, lineOf(c, testSKU)) // the test's turn ends: the queued order leads
		c.mu.Unlock()
		<-left
		if msg := restState(c); msg != "" {
			t.Fatalf("round %d, the lead lost when the order left: %s", round, msg)
		}
	}
}

// An order told to lead whose script another leader sends and answers
// before it acts passes the lead on (it sends no pipeline of others'
// orders: its answer is in). Whether it sees the lead or its answer first
// is up to the scheduler; both branches pass the lead on.
func TestCoalescerLeadPassesOnFromAnOrderAlreadyAnswered(t *testing.T) {
	c, _, _ := newTestCoalescer(t, 2)
	keys := unloadedKeys(c)
	for round := range 200 {
		playLeaders(c, 2)
		answered := make(chan error, 1)
		go func() { _, err := c.run(context.Background(), testSKU, keys, unloadedArgs); answered <- err }()
		waitFor(t, c, func() bool { return queued(c) == 1 })
		c.mu.Lock()
		ln := lineOf(c, testSKU)
		c.handOnLocked(testSKU, ln) // the first leader's turn ends: the order is told to lead
		batch := []*scriptCall{ln.queue[0]}
		ln.queue = ln.queue[:0]
		batch[0].queued = false
		// The second leader sends it and answers, before the order can
		// act on being told (acting needs the mutex).
		c.send(context.Background(), batch)
		c.handOnLocked(testSKU, ln) // the second leader's turn ends
		c.mu.Unlock()
		if err := <-answered; err != nil {
			t.Fatal(err)
		}
		if msg := restState(c); msg != "" {
			t.Fatalf("round %d, the lead lost after the order's answer: %s", round, msg)
		}
	}
}

// pastDeadline: ctx's deadline has come (its own timer may fire a moment
// after the pipeline's, set to the same instant).
func pastDeadline(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// waitFor waits until the coalescer's state meets cond, checking it after
// each change the coalescer reports.
func waitFor(t *testing.T, c *coalescer, cond func() bool) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		c.mu.Lock()
		ok := cond()
		c.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-c.changed:
		case <-timeout:
			t.Fatal("state not reached in 10 s")
		}
	}
}
