package redislock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/flashsale/stock/internal/locking"
)

// result is one node's answer in a parallel call.
type result struct {
	node int
	v    any // the script's reply
	err  error
}

// run calls f on every node in parallel, each call bounded by timeout (the
// node timeout, or a release's longer one), and returns the answers as soon
// as decided says the outcome is known (or all answered): a dead node must
// not hold up a majority that has answered. Calls still running then
// finish in the background, counted in wg; join wg before touching those
// nodes again for the same attempt.
func (q *quorum) run(ctx context.Context, wg *sync.WaitGroup, timeout time.Duration,
	f func(ctx context.Context, i int, n rnode) (any, error), decided func(answers []result) bool,
) []result {
	ch := make(chan result, len(q.nodes)) // never blocks a straggler
	q.mu.Lock()
	if wg == &q.bg && q.draining {
		// Close is waiting for bg already and would not see these calls:
		// they are this caller's to join.
		wg = new(sync.WaitGroup)
		defer wg.Wait()
	}
	wg.Add(len(q.nodes))
	q.running[wg] += len(q.nodes)
	q.mu.Unlock()
	for i, n := range q.nodes {
		go func() {
			defer wg.Done()
			defer q.ran(wg)
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			v, err := f(ctx, i, n)
			if err != nil {
				err = &locking.NodeError{Node: n.name, Err: err}
			}
			ch <- result{node: i, v: v, err: err}
		}()
	}
	answers := make([]result, 0, len(q.nodes))
	for range q.nodes {
		answers = append(answers, <-ch)
		if decided != nil && decided(answers) {
			break
		}
	}
	return answers
}

func (q *quorum) ran(wg *sync.WaitGroup) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.running[wg]--; q.running[wg] <= 0 {
		delete(q.running, wg)
	}
}

// settled reports whether every call of run counted in wg has returned.
func (q *quorum) settled(wg *sync.WaitGroup) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.running[wg] == 0
}

// counted decides once ok answers reach a majority or can no longer reach it.
func (q *quorum) counted(ok func(result) bool) func([]result) bool {
	return func(answers []result) bool {
		yes := 0
		for _, r := range answers {
			if ok(r) {
				yes++
			}
		}
		return yes >= q.need || len(answers)-yes > len(q.nodes)-q.need
	}
}

func isOne(r result) bool {
	n, ok := r.v.(int64)
	return r.err == nil && ok && n == 1
}

func nodeErrors(answers []result) []error {
	var errs []error
	for _, r := range answers {
		if r.err != nil {
			errs = append(errs, r.err)
		}
	}
	return errs
}

// extend renews the lock on every node; it stays held if a majority renewed
// it within the validity window. A node that lost the key (restarted empty)
// is taken back, and every node's fencing counter raised to ours.
func (q *quorum) extend(ctx context.Context, a *attempt) (time.Time, error) {
	a.pending.Wait()
	start := time.Now()
	answers := q.run(ctx, a.pending, q.cfg.nodeTimeout, func(ctx context.Context, i int, n rnode) (any, error) {
		return redlockExtend.Run(ctx, n.client, []string{a.key, a.key + ":fence"}, a.token, ms(q.cfg.ttl), locking.EpochOf(a.fence)).Int64()
	}, q.counted(isOne))
	n := 0
	for _, ans := range answers {
		if isOne(ans) {
			n++
		}
	}
	until := start.Add(q.cfg.ttl - q.cfg.drift())
	if n < q.need || !time.Now().Before(until) {
		return time.Time{}, errors.Join(append([]error{
			fmt.Errorf("%w: %s: renewed on %d of %d nodes, %d needed", locking.ErrLockLost, a.key, n, len(q.nodes), q.need),
		}, nodeErrors(answers)...)...)
	}
	return until, nil
}

// leave releases a held lock to everyone (local hand-overs are core's
// handOver); the next local waiter listens for the release's announcement
// like every other waiter before it tries.
func (q *quorum) leave(ctx context.Context, a *attempt, next *attempt) (slotGrant, error) {
	if a.fence == 0 {
		// Never held: a failed round released already (and retired its
		// token); a gate call of the current token may still land.
		q.leaveGateQueue(ctx, a, true)
		return slotGrant{}, nil
	}
	q.leaveGateQueue(ctx, a, false) // if removing it after the win failed; release retires the token
	// A lease's release is not on an acquisition's path (the next local
	// waiter waits for its outcome, which it needs; core.abandon's rare
	// give-back of a lock whose validity ran out goes through here too):
	// its calls get the longer timeout of the calls off that path. Under
	// the node timeout's 50 ms a release on durable servers under load
	// (appendfsync always) gave up on every node, reported the lock lost
	// and left the key on them for the next holder to wait out.
	n, errs := q.releaseSettled(ctx, q.cfg.unhurriedTimeout(), a.pending, a.key, a.token, nil, true)
	var g slotGrant
	if next != nil && n > 0 {
		// The next local waiter listens for the release's announcement,
		// which the release script sends only where it deleted the key.
		// If it deleted it nowhere (the lock had expired, or was reset),
		// no announcement comes: the waiter tries at once instead of
		// sleeping a poll interval on a free lock.
		g = slotGrant{kind: grantReleased, armed: true}
	}
	if n >= q.need {
		return g, nil
	}
	return g, errors.Join(append([]error{
		fmt.Errorf("%w: %s: released on %d of %d nodes, %d needed", locking.ErrLockLost, a.key, n, len(q.nodes), q.need),
	}, errs...)...)
}

// releaseSettled releases token's lock like release, waiting for the calls
// for it still running (counted in pending) a tenth of the node timeout at
// most: a node that hangs holds such a call for the whole node timeout,
// and the lock's next holder must not wait for that (with a node hung,
// every release did). Instead, once those calls have returned, the
// lock is released again (unannounced) in the background, joined by Close:
// a late acquisition or renewal that put our key back on a slow node is
// deleted then, as when release waited for it. (A call the client gave up
// on may still reach a hung server when it resumes; waiting did not
// prevent that either. It leaves our key on one node for one TTL, a
// minority: an obstacle, never a second holder.)
func (q *quorum) releaseSettled(ctx context.Context, timeout time.Duration, pending *sync.WaitGroup, key, token string, skip map[int]bool, publish bool) (int, []error) {
	if q.settled(pending) {
		return q.release(ctx, timeout, key, token, skip, publish)
	}
	// A node that answers answers within a fraction of the node timeout:
	// give the calls that long, so that only a node that hangs costs the
	// second release.
	done := make(chan struct{})
	q.background(func() {
		pending.Wait()
		close(done)
	})
	grace := time.NewTimer(q.cfg.nodeTimeout / 10)
	defer grace.Stop()
	select {
	case <-done:
		return q.release(ctx, timeout, key, token, skip, publish)
	case <-grace.C:
	}
	n, errs := q.release(ctx, timeout, key, token, skip, publish)
	q.background(func() {
		<-done
		q.release(ctx, timeout, key, token, skip, false)
	})
	return n, errs
}

// release deletes token's lock on every node but skip (announcing the
// release if publish), each call bounded by timeout. With calls for the
// lock still running, use releaseSettled. It returns when a majority
// confirmed, or cannot; the rest finish in the background, joined by
// Close.
func (q *quorum) release(ctx context.Context, timeout time.Duration, key, token string, skip map[int]bool, publish bool) (int, []error) {
	pub := "0"
	if publish {
		pub = "1"
	}
	answers := q.run(ctx, &q.bg, timeout, func(ctx context.Context, i int, n rnode) (any, error) {
		if skip[i] {
			return int64(0), nil
		}
		return redlockRelease.Run(ctx, n.client, []string{key}, token, key+":wake", pub, ms(q.cfg.ttl)).Int64()
	}, q.counted(isOne))
	n := 0
	for _, ans := range answers {
		if isOne(ans) {
			n++
		}
	}
	return n, nodeErrors(answers)
}

// reset deletes the lock's keys on every node; unlike the lock calls it
// waits for every node (up to a second each, unhurriedTimeout): it is an
// administrative call, and "best effort on all nodes" means trying all of
// them.
func (q *quorum) reset(ctx context.Context, key string) error {
	var wg sync.WaitGroup
	timeout := q.cfg.unhurriedTimeout()
	errs := make([]error, len(q.nodes))
	for i, n := range q.nodes {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			if err := resetScript.Run(ctx, n.client, lockKeys(key), ms(q.cfg.ttl)).Err(); err != nil {
				errs[i] = &locking.NodeError{Node: n.name, Err: err}
			}
		})
	}
	wg.Wait()
	errs = compact(errs)
	if answered := len(q.nodes) - len(errs); answered < q.need {
		return errors.Join(append([]error{
			fmt.Errorf("locking: reset %s: %d of %d nodes answered, %d needed", key, answered, len(q.nodes), q.need),
		}, errs...)...)
	}
	return nil
}

// resetAll is reset for many keys: each node's in pipelines, the nodes at
// once, each round trip under the node timeout; a node that failed any of
// them counts as not answering.
func (q *quorum) resetAll(ctx context.Context, keys []string) error {
	var wg sync.WaitGroup
	errs := make([]error, len(q.nodes))
	for i, n := range q.nodes {
		wg.Go(func() {
			if err := resetKeys(ctx, n.client, keys, q.cfg.ttl, q.cfg.unhurriedTimeout()); err != nil {
				errs[i] = &locking.NodeError{Node: n.name, Err: err}
			}
		})
	}
	wg.Wait()
	errs = compact(errs)
	if answered := len(q.nodes) - len(errs); answered < q.need {
		return errors.Join(append([]error{
			fmt.Errorf("locking: reset %d keys: %d of %d nodes answered, %d needed", len(keys), answered, len(q.nodes), q.need),
		}, errs...)...)
	}
	return nil
}

func (q *quorum) drain() {
	q.mu.Lock()
	q.draining = true
	q.mu.Unlock()
	q.bg.Wait()
}

// background runs f on a goroutine that Close joins, or, once Close has
// begun to join them (a Release racing Close), on the caller's goroutine:
// a goroutine added to bg while Close waits for it would be a WaitGroup
// misuse, and nothing would join it.
func (q *quorum) background(f func()) {
	q.mu.Lock()
	if q.draining {
		q.mu.Unlock()
		f()
		return
	}
	q.bg.Add(1)
	q.mu.Unlock()
	go func() {
		defer q.bg.Done()
		f()
	}()
}

func compact(errs []error) []error {
	var out []error
	for _, e := range errs {
		if e != nil {
			out = append(out, e)
		}
	}
	return out
}
