package redislock

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/locking"
)

// Redlock is a lock over N independent Redis servers (N odd, at least 3):
// it is held while a majority of them hold it, so it survives the loss of a
// minority. Fencing tokens stay monotonic across such losses (see the
// package documentation). Like Locker, waiters queue locally (FIFO) and are
// woken by pub/sub; split votes back off with jitter.
type Redlock struct {
	c *core
	q *quorum
}

// NewRedlock returns a Redlock over clients, one per independent server
// (not replicas of each other). It fails unless len(clients) is odd and at
// least 3: with an even count a majority buys nothing over the next lower
// odd count. Close it to stop its pub/sub listeners.
func NewRedlock(clients []*redis.Client, opts ...Option) (*Redlock, error) {
	cs := make([]Client, len(clients))
	for i, c := range clients {
		cs[i] = c
	}
	return newRedlock(cs, opts...)
}

func newRedlock(clients []Client, opts ...Option) (*Redlock, error) {
	if len(clients) < 3 || len(clients)%2 == 0 {
		return nil, fmt.Errorf("locking: Redlock needs an odd number of at least 3 servers, got %d", len(clients))
	}
	cfg := defaultConfig(50 * time.Millisecond)
	for _, o := range opts {
		o(&cfg)
	}
	q := &quorum{need: len(clients)/2 + 1, running: map[*sync.WaitGroup]int{},
		gateDown: make([]atomic.Int64, len(clients)), gateFails: make([]atomic.Int32, len(clients))}
	notifiers := make([]*notifier, len(clients))
	for i, cl := range clients {
		q.nodes = append(q.nodes, rnode{name: nodeName(cl, i), client: cl})
		q.byName = append(q.byName, i)
		notifiers[i] = newNotifier(cl)
	}
	slices.SortStableFunc(q.byName, func(i, j int) int { return strings.Compare(q.nodes[i].name, q.nodes[j].name) })
	c := newCore(cfg, q, notifiers)
	q.c, q.cfg = c, &c.cfg
	return &Redlock{c: c, q: q}, nil
}

// Acquire takes the lock named key on a majority of the servers, waiting
// while it is held (see WithWait). The fencing token is fixed on a majority
// before Acquire returns. Reentrancy works as for Locker.Acquire.
//
// A wait that ends fails with errors.Join(locking.ErrNotObtained, ctx.Err(), the
// NodeErrors of the last round...): with a majority of servers down it fails
// closed, never open.
func (r *Redlock) Acquire(ctx context.Context, key string) (*Lease, error) {
	return r.c.acquire(ctx, key)
}

// Reset deletes the lock named key on every server it can reach (best
// effort) and fails if fewer than a majority answered. Like Locker.Reset it
// frees a stuck lock and keeps the fencing counters: tokens never go back.
// A holder of the key loses it at its next renewal: Reset leaves a
// tombstone for the value it removed, so the renewal, which takes back a
// key missing on a node (restarted empty), does not take it back there.
func (r *Redlock) Reset(ctx context.Context, key string) error {
	r.c.endChain(r.c.cfg.prefix + key)
	return r.q.reset(ctx, r.c.cfg.prefix+key)
}

// AdvanceFence makes every later token of key greater than atLeast, as
// Locker.AdvanceFence does (with its exception for other processes). It raises the counter on every server it can
// reach and fails unless a majority answered: a later token is above every
// counter it read on a majority, and any majority meets the one raised here.
func (r *Redlock) AdvanceFence(ctx context.Context, key string, atLeast int64) error {
	if err := checkAdvance(atLeast); err != nil {
		return err
	}
	fence := r.c.cfg.prefix + key + ":fence"
	timeout := max(r.c.cfg.nodeTimeout, time.Second)
	errs := make([]error, len(r.q.nodes))
	var wg sync.WaitGroup
	for i, n := range r.q.nodes {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			if err := advanceFence.Run(ctx, n.client, []string{fence}, counterFloor(atLeast)).Err(); err != nil {
				errs[i] = &locking.NodeError{Node: n.name, Err: err}
			}
		})
	}
	wg.Wait()
	errs = compact(errs)
	if answered := len(r.q.nodes) - len(errs); answered < r.q.need {
		return errors.Join(append([]error{
			fmt.Errorf("locking: advance fence of %s: %d of %d nodes answered, %d needed", key, answered, len(r.q.nodes), r.q.need),
		}, errs...)...)
	}
	// After the counters: a chain that read its counters before the writes
	// exists in this process by now, and learns of the floor.
	r.c.raiseFenceFloor(r.c.cfg.prefix+key, atLeast)
	return nil
}

// Close ends waiting Acquires, cancels the context of leases still held,
// stops the pub/sub listeners and joins every goroutine of the Redlock. It
// does not close the clients.
func (r *Redlock) Close() error { return r.c.close() }

type rnode struct {
	name   string
	client Client
}

type quorum struct {
	c      *core
	cfg    *config
	nodes  []rnode
	byName []int          // node indexes in the order of their names
	need   int            // majority
	bg     sync.WaitGroup // release calls still running after Release returned; Close joins them

	mu       sync.Mutex
	draining bool                    // Close is joining bg: a call started now must be joined by its caller
	running  map[*sync.WaitGroup]int // calls of run still running, by the WaitGroup that counts them

	gateDown  []atomic.Int64 // by node: until when (Unix ns) it is passed over as a gate (gateFor)
	gateFails []atomic.Int32 // by node: gate calls failed in a row
}

// gate returns the node a contender for key tries first (see tryGate). It
// is picked by the key's hash among the nodes sorted by name, so processes
// that list the same servers in another order still agree on it.
func (q *quorum) gate(key string) int { return q.byName[q.gateRank(key)] }

// gateRank is the place of key's gate node in the order of names.
func (q *quorum) gateRank(key string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % uint32(len(q.byName)))
}

// gateFor returns the node that serves as key's gate now: its gate node,
// or, while a gate call to that node failed within the last poll interval
// (gateDown), the next node in name order for which none did. Processes
// that see the same servers fail agree on it; when they do not, contenders
// split their votes for a while, as without a gate.
func (q *quorum) gateFor(key string) int {
	first := q.gateRank(key)
	now := time.Now().UnixNano()
	for k := range q.byName {
		if i := q.byName[(first+k)%len(q.byName)]; q.gateDown[i].Load() <= now {
			return i
		}
	}
	return q.byName[first]
}

// gateState is what the gate node said.
type gateState int

const (
	gateUnknown gateState = iota // no answer: go on to a full round without it
	gateOurs                     // ours now: go on to a full round
	gateTaken                    // another contender has it: wait for its release
	gateQueued                   // free, but an older waiter is first in line
)

// tryGate runs the gate script on key's gate node alone before a full
// round: contenders queue there, oldest first, and only the first in line
// may take the gate. Without it, the contenders that all start a round on
// the same release announcement split the votes (each takes a node or two,
// nobody a majority, all release and back off), and the one who wins is
// whoever is lucky, which makes waits long-tailed and unfair. With it, the
// holder of the gate goes on to a full round that it nearly always wins,
// and processes take turns in the order they started waiting. The gate
// decides nothing about safety (the full round still needs a majority);
// when it does not answer, contenders race without it.
//
// It returns the gate's state; with gateTaken, the holder's remaining life;
// with gateOurs, the gate node's fencing counter, from which the full round
// proposes our token (see settle).
//
// A gate node that did not answer is passed over for a poll interval: the
// next node in name order that answers serves as the gate meanwhile
// (gateFor), rather than every contender paying a node timeout for it and
// then racing without a gate.
func (q *quorum) tryGate(ctx context.Context, a *attempt) (state gateState, pttl time.Duration, counter int64) {
	// A gate that does not answer is passed over from then on: try the
	// next one at once, rather than race without a gate. A minority of the
	// nodes can be down; at most a majority of tries finds one that is not.
	tried := -1
	for range q.need {
		gate := q.gateFor(a.key)
		if gate == tried {
			break
		}
		tried = gate
		state, pttl, counter = q.tryGateAt(ctx, a, gate)
		if state != gateUnknown || ctx.Err() != nil {
			break
		}
	}
	return state, pttl, counter
}

func (q *quorum) tryGateAt(ctx context.Context, a *attempt, gate int) (state gateState, pttl time.Duration, counter int64) {
	a.gate = gate
	if !slices.Contains(a.gates, gate) {
		a.gates = append(a.gates, gate)
	}
	n := q.nodes[a.gate]
	wctx := ctx
	ctx, cancel := context.WithTimeout(ctx, q.cfg.nodeTimeout)
	defer cancel()
	defer func() {
		switch {
		case state != gateUnknown:
			q.gateFails[a.gate].Store(0)
			q.gateDown[a.gate].Store(0)
		case wctx.Err() == nil: // the node's fault, not the end of our wait
			// Looked at again after a poll interval, doubling up to 8
			// while it keeps failing: for a hung node each look costs a
			// node timeout.
			fails := q.gateFails[a.gate].Add(1)
			d := q.cfg.pollInterval << min(fails-1, 3)
			q.gateDown[a.gate].Store(time.Now().Add(d).UnixNano())
		}
	}()
	// The entry lives until our wait ends, or until we have not looked at
	// the gate for a while (each look refreshes it): a crashed waiter then
	// blocks the line for about two poll intervals, not for its whole wait.
	life := min(time.Until(a.deadline), 2*q.cfg.pollInterval+q.cfg.nodeTimeout)
	v, err := redlockGate.Run(ctx, n.client, lockKeys(a.key), a.token, ms(q.cfg.ttl), ms(life), a.gateID()).Slice()
	if err != nil {
		a.element = unknownElement // the script may have queued us
		return gateUnknown, 0, 0
	}
	code, num, el, err := triple(v)
	if err != nil {
		return gateUnknown, 0, 0
	}
	a.element = el
	switch code {
	case 1:
		return gateOurs, 0, num
	case 0:
		return gateTaken, time.Duration(num) * time.Millisecond, 0
	default:
		return gateQueued, 0, 0
	}
}

// gateID names a in the gate's queue: the token it started with.
func (a *attempt) gateID() string {
	if a.queueID != "" {
		return a.queueID
	}
	return a.token
}

// leaveGateQueue removes a's entry from the gate node's queue, if it may
// have one: an attempt that gave up, or that won without the gate, must not
// stay first in line until its deadline. An attempt that gives up (giveUp)
// also retires its token on every node it sent a gate call with that token
// to (a.gates), not only the gate of its last look: a gate call that timed
// out, and made it pass that node over for a stand-in, may land later,
// when the key is free there, and take the gate for a TTL under a value
// nobody will release. (Entries left on the other gate nodes expire on
// their own, see tryGate.)
//
// A node that did not answer our last gate call (passed over, gateDown) is
// waited for a tenth of the node timeout at most, not the whole of it: the
// caller is a release, often, and the next holder must not wait for a hung
// node. The call goes on in the background, joined by Close.
func (q *quorum) leaveGateQueue(ctx context.Context, a *attempt, giveUp bool) {
	var nodes []int
	if a.element != "" {
		nodes = append(nodes, a.gate)
	}
	retired := ""
	if giveUp {
		retired = a.token
		for _, g := range a.gates {
			if !slices.Contains(nodes, g) {
				nodes = append(nodes, g)
			}
		}
	}
	if len(nodes) == 0 {
		return
	}
	type answer struct {
		node int
		err  error
	}
	ch := make(chan answer, len(nodes)) // never blocks a straggler
	id, key := a.gateID(), a.key
	now := time.Now().UnixNano()
	waiting := make(map[int]bool, len(nodes)) // node → passed over (waited for the grace only)
	for _, i := range nodes {
		waiting[i] = q.gateDown[i].Load() > now
		n := q.nodes[i]
		q.background(func() {
			ctx, cancel := context.WithTimeout(ctx, q.cfg.nodeTimeout)
			defer cancel()
			ch <- answer{i, redlockGateLeave.Run(ctx, n.client, lockKeys(key), id, retired, ms(q.cfg.ttl)).Err()}
		})
	}
	if waiting[a.gate] {
		a.element = "" // an entry left behind expires on its own
	}
	grace := time.NewTimer(q.cfg.nodeTimeout / 10)
	defer grace.Stop()
	for len(waiting) > 0 {
		select {
		case r := <-ch:
			delete(waiting, r.node)
			if r.node == a.gate && r.err == nil {
				a.element = ""
			}
		case <-grace.C:
			maps.DeleteFunc(waiting, func(_ int, down bool) bool { return down })
		}
	}
}

// result is one node's answer in a parallel call.
type result struct {
	node int
	v    any // the script's reply
	err  error
}

// run calls f on every node in parallel, each call bounded by the node
// timeout, and returns the answers as soon as decided says the outcome is
// known (or all answered): a dead node must not hold up a majority that has
// answered. Calls still running then finish in the background, counted in
// wg; join wg before touching those nodes again for the same attempt.
func (q *quorum) run(ctx context.Context, wg *sync.WaitGroup,
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
			ctx, cancel := context.WithTimeout(ctx, q.cfg.nodeTimeout)
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
func (q *quorum) releaseSettled(ctx context.Context, pending *sync.WaitGroup, key, token string, skip map[int]bool, publish bool) (int, []error) {
	if q.settled(pending) {
		return q.release(ctx, key, token, skip, publish)
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
		return q.release(ctx, key, token, skip, publish)
	case <-grace.C:
	}
	n, errs := q.release(ctx, key, token, skip, publish)
	q.background(func() {
		<-done
		q.release(ctx, key, token, skip, false)
	})
	return n, errs
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

// round is the outcome of one acquisition round.
type round struct {
	proposal int64 // the counter proposed with the round, 0 for none
	ours     []int // nodes where the lock is ours
	counter  int64 // highest fencing counter among them, as read before the proposal's write
	holders  map[string]int
	pttl     map[string]time.Duration // shortest remaining life of each holder
	others   map[int]bool             // nodes held by someone else
	errs     []error
}

// tryAll runs the acquire script on every node. With a proposed counter p
// (> 0), each node where the lock becomes ours also raises its counter to
// p, in the same script: when the counters it read on a majority are all
// below p, settle needs no second round (doc.go).
func (q *quorum) tryAll(ctx context.Context, a *attempt, p int64) round {
	won := func(r result) bool {
		v, ok := r.v.([]any)
		return r.err == nil && ok && len(v) == 3 && v[0] == int64(1)
	}
	// Calls left running after the round is decided must not be cut short
	// when Acquire returns (its wait context ends then): a late SET that
	// lands puts the lock on one more node, which is what lets the holder
	// survive the loss of others. The node timeout still bounds them.
	token := a.token // the calls may outlive the round; a.token may not
	answers := q.run(context.WithoutCancel(ctx), a.pending, func(ctx context.Context, i int, n rnode) (any, error) {
		return redlockAcquire.Run(ctx, n.client, []string{a.key, a.key + ":fence"}, token, ms(q.cfg.ttl), p).Slice()
	}, q.counted(won))
	r := round{proposal: p, holders: map[string]int{}, pttl: map[string]time.Duration{}, others: map[int]bool{}}
	for _, ans := range answers {
		if ans.err != nil {
			r.errs = append(r.errs, ans.err)
			continue
		}
		ok, num, holder, err := triple(ans.v.([]any))
		switch {
		case err != nil:
			r.errs = append(r.errs, &locking.NodeError{Node: q.nodes[ans.node].name, Err: err})
		case ok == 1:
			r.ours = append(r.ours, ans.node)
			r.counter = max(r.counter, num)
		case holder != "":
			r.others[ans.node] = true
			r.holders[holder]++
			d := time.Duration(num) * time.Millisecond
			if p, seen := r.pttl[holder]; !seen || d < p {
				r.pttl[holder] = d
			}
		}
	}
	return r
}

// top returns the contender holding the most nodes.
func (r *round) top() (string, int) {
	var who string
	n := 0
	for h, c := range r.holders {
		if c > n {
			who, n = h, c
		}
	}
	return who, n
}

func (q *quorum) acquire(ctx context.Context, ks *keyState, a *attempt, g slotGrant) error {
	cfg := q.cfg
	a.queueID = a.token
	var subs []*subscription
	defer func() {
		for _, s := range subs {
			s.disarm(a.inbox)
		}
	}()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	if g.kind == grantReleased && g.armed {
		// Our predecessor gave the lock back to everyone: start when the
		// release is announced, like the other processes' waiters, not
		// before them.
		subs = q.c.watch(ks)
		t.Reset(cfg.pollInterval)
		q.wait(ctx, a, t, true)
	}
	splits := 0
	// startListening subscribes, the first time we find the lock taken,
	// and reports whether it did: the caller then looks again before it
	// waits, since a release announced before the subscription was
	// confirmed would not wake us. It waits for a majority of the servers
	// to confirm, not for all (awaitConfirmed): a server that is down or
	// hung never does, and must not keep us awake. Nor does it wait long
	// for the majority: without it we sleep on timers (polling), and a
	// confirmation that comes later wakes us to look again.
	startListening := func() bool {
		if subs != nil {
			return false
		}
		subs = q.c.watch(ks)
		for _, s := range subs {
			s.arm(a.inbox)
		}
		awaitConfirmed(ctx, a.inbox, subs, q.need, max(2*cfg.nodeTimeout, 20*time.Millisecond))
		return true
	}
	bypassGate := false
	queuedBefore := false // the last look found the gate free but someone else first
	var lastErrs []error  // the node errors of the last round, for the caller
	for {
		if ctx.Err() != nil {
			return q.c.notObtained(ctx, lastErrs...)
		}
		a.inbox.take() // what arrived before this round is stale
		gateState, pttl, counter := gateUnknown, time.Duration(0), int64(0)
		if !bypassGate {
			gateState, pttl, counter = q.tryGate(ctx, a)
		}
		bypassGate = false
		if gateState == gateQueued && queuedBefore {
			// The gate stayed free with the same kind of answer after a
			// wait: whoever is first in line is not taking it (a crashed
			// waiter keeps its place until its entry expires). Race.
			gateState = gateUnknown
		}
		queuedBefore = false
		if gateState == gateTaken || gateState == gateQueued {
			// Someone is ahead of us: a release (or a failed round's
			// undoing of the gate) wakes us, else the holder's TTL or the
			// poll interval. A free gate that someone else is first in
			// line for is looked at again soon: the first in line takes
			// it within a round trip if it is alive.
			if startListening() {
				continue
			}
			d := cfg.pollInterval
			switch gateState {
			case gateTaken:
				d = min(d, pttl+time.Millisecond)
			case gateQueued:
				d = min(d, max(2*cfg.nodeTimeout, 10*time.Millisecond))
			}
			t.Reset(d)
			q.c.waiting(a.key)
			woken := q.wait(ctx, a, t, true)
			if ctx.Err() != nil {
				return q.c.notObtained(ctx, lastErrs...)
			}
			// Nothing announced before the timer: a taken gate may be
			// held by nobody who will release it (a contender whose gate
			// call landed after it gave up leaves it for a TTL), so race
			// without it once rather than trust it.
			bypassGate = !woken && gateState == gateTaken
			queuedBefore = !woken && gateState == gateQueued
			continue
		}
		var p int64
		if gateState == gateOurs && counter < maxCounter {
			// The gate node's counter is, nearly always, what every node
			// holds: the last holder wrote its counter everywhere. So
			// propose the next one with the round.
			p = counter + 1
		}
		start := time.Now()
		r := q.tryAll(ctx, a, p)
		lastErrs = r.errs
		if q.settle(ctx, a, &r, start) {
			q.leaveGateQueue(context.WithoutCancel(ctx), a, false)
			return nil
		}
		// Our SET may have landed where the answer was late or lost:
		// release wherever it may have, that is wherever the round did not
		// see another holder. Announce the release if we held a majority,
		// or if we held the gate and nobody holds a majority: the waiters
		// behind us would otherwise sleep until they poll. (When someone
		// does hold a majority, its own release will wake them.)
		_, topVotes := r.top()
		heldGate := gateState == gateOurs || slices.Contains(r.ours, a.gate)
		// A gate node where the round saw another holder is released too
		// (the script leaves the token's tombstone whatever it finds): a
		// gate call of this token may still be on its way there.
		skip := r.others
		for _, g := range a.gates {
			if skip[g] {
				skip = maps.Clone(r.others)
				for _, g := range a.gates {
					delete(skip, g)
				}
				break
			}
		}
		q.releaseSettled(context.WithoutCancel(ctx), a.pending, a.key, a.token, skip, len(r.ours) >= q.need || heldGate && topVotes < q.need)
		// The next round sets a new value. With the same one, a release
		// call of this round that reaches a node late (after the client
		// gave up on it, even) would find the key "already ours" again
		// and delete the lock the next round counted there. Our place in
		// the gate's queue keeps its name (queueID). The calls of the
		// old value are counted apart, in the group the release above
		// waits on in the background: a WaitGroup must not be added to
		// from zero while a Wait of it may still be returning (a review
		// found a renewal of the next round crashing the process so).
		a.token, a.pending, a.gates = newToken(), new(sync.WaitGroup), nil
		if ctx.Err() != nil {
			q.leaveGateQueue(context.WithoutCancel(ctx), a, false) // the new token was never sent
			return q.c.notObtained(ctx, r.errs...)
		}
		if startListening() {
			continue
		}
		var d time.Duration
		holder, n := r.top()
		listen := n >= q.need
		if listen {
			// Someone holds a majority: its release (announced on every
			// node) wakes us. Its TTL running out, or the poll interval,
			// wakes us otherwise.
			splits = 0
			d = cfg.pollInterval
			if p := r.pttl[holder]; p > 0 && p+time.Millisecond < d {
				d = p + time.Millisecond
			}
		} else {
			// A split vote, or nodes unreachable or not heard from: nobody
			// is coming to wake us. Back off for a random while, longer
			// after each split, so that contenders stop colliding.
			splits++
			d = time.Duration(rand.Int64N(int64(min(cfg.retryJitter<<min(splits-1, 3), cfg.pollInterval)))) + time.Millisecond
		}
		t.Reset(d)
		q.c.waiting(a.key)
		q.wait(ctx, a, t, listen)
		if ctx.Err() != nil {
			return q.c.notObtained(ctx, r.errs...)
		}
	}
}

// wait returns when t fires, ctx ends, or (listen) a release is announced
// or we are told to poll; it reports whether a message woke it. Only
// holders of a majority (and a gate holder whose round split) announce a
// release, and a process announces nothing until its batch of hand-overs
// ends, so any announcement is worth a new look.
func (q *quorum) wait(ctx context.Context, a *attempt, t *time.Timer, listen bool) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return false
		case <-a.inbox.c:
		}
		if listen {
			return true
		}
	}
}

// settle turns a round with a majority into a held lock. It checks the
// validity and fixes the chain's counter, from which the fencing token
// follows (token.go): the round's proposal if every counter it read was
// below it (the round raised them to it already), else one more than the
// highest counter read, written back (set-if-greater) in a second round;
// the lock is held only if a majority took the counter in time.
func (q *quorum) settle(ctx context.Context, a *attempt, r *round, start time.Time) bool {
	cfg := q.cfg
	valid := cfg.ttl - cfg.drift()
	if len(r.ours) < q.need || time.Since(start) >= valid {
		return false
	}
	if p := r.proposal; p > r.counter {
		a.fence, a.validUntil = chainStart(p), start.Add(valid)
		return true
	}
	counter := r.counter + 1
	if counter > maxCounter {
		_, err := startOf(counter)
		r.errs = append(r.errs, err)
		return false
	}
	// Written to every node, not only those the round heard from: the
	// script writes only where the lock is ours, and late answers of the
	// round may have made it ours on more nodes. The more nodes carry the
	// token, the more node losses the fencing survives (doc.go).
	token := a.token
	answers := q.run(context.WithoutCancel(ctx), a.pending, func(ctx context.Context, i int, n rnode) (any, error) {
		return redlockFence.Run(ctx, n.client, []string{a.key, a.key + ":fence"}, token, counter).Int64()
	}, q.counted(isOne))
	r.errs = append(r.errs, nodeErrors(answers)...)
	n := 0
	for _, ans := range answers {
		if isOne(ans) {
			n++
		}
	}
	if n < q.need || time.Since(start) >= valid {
		return false
	}
	a.fence, a.validUntil = chainStart(counter), start.Add(valid)
	return true
}

// release deletes token's lock on every node but skip (announcing the
// release if publish). With calls for the lock still running, use
// releaseSettled. It returns when a
// majority confirmed, or cannot; the rest finish in the background, joined
// by Close.
func (q *quorum) release(ctx context.Context, key, token string, skip map[int]bool, publish bool) (int, []error) {
	pub := "0"
	if publish {
		pub = "1"
	}
	answers := q.run(ctx, &q.bg, func(ctx context.Context, i int, n rnode) (any, error) {
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
	n, errs := q.releaseSettled(ctx, a.pending, a.key, a.token, nil, true)
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

// extend renews the lock on every node; it stays held if a majority renewed
// it within the validity window. A node that lost the key (restarted empty)
// is taken back, and every node's fencing counter raised to ours.
func (q *quorum) extend(ctx context.Context, a *attempt) (time.Time, error) {
	a.pending.Wait()
	start := time.Now()
	answers := q.run(ctx, a.pending, func(ctx context.Context, i int, n rnode) (any, error) {
		return redlockExtend.Run(ctx, n.client, []string{a.key, a.key + ":fence"}, a.token, ms(q.cfg.ttl), counterOf(a.fence)).Int64()
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

// reset deletes the lock's keys on every node; unlike the lock calls it
// waits for every node (up to a second each): it is an administrative call,
// and "best effort on all nodes" means trying all of them.
func (q *quorum) reset(ctx context.Context, key string) error {
	var wg sync.WaitGroup
	timeout := max(q.cfg.nodeTimeout, time.Second)
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

func compact(errs []error) []error {
	var out []error
	for _, e := range errs {
		if e != nil {
			out = append(out, e)
		}
	}
	return out
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

func (q *quorum) channel(key string) string { return key + ":wake" }
