package redislock

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/flashsale/stock/internal/locking"
)

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
	answers := q.run(context.WithoutCancel(ctx), a.pending, q.cfg.nodeTimeout, func(ctx context.Context, i int, n rnode) (any, error) {
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

// settle turns a round with a majority into a held lock. It checks the
// validity and fixes the chain's counter, from which the fencing token
// follows (startOf): the round's proposal if every counter it read was
// below it (the round raised them to it already), else one more than the
// highest counter read, written back (set-if-greater) in a second round;
// the lock is held only if a majority took the counter in time.
func (q *quorum) settle(ctx context.Context, a *attempt, r *round, start time.Time) bool {
	cfg := q.cfg
	valid := cfg.ttl - cfg.drift()
	if len(r.ours) < q.need || time.Since(start) >= valid {
		return false
	}
	counter, proposed := r.counter+1, r.proposal > r.counter
	if proposed {
		counter = r.proposal // the round raised the counters to it already
	}
	fence, err := startOf(counter)
	if err != nil {
		r.errs = append(r.errs, err)
		return false
	}
	if !proposed {
		// Written to every node, not only those the round heard from: the
		// script writes only where the lock is ours, and late answers of the
		// round may have made it ours on more nodes. The more nodes carry the
		// token, the more node losses the fencing survives (doc.go).
		token := a.token
		answers := q.run(context.WithoutCancel(ctx), a.pending, q.cfg.nodeTimeout, func(ctx context.Context, i int, n rnode) (any, error) {
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
	}
	a.fence, a.validUntil = fence, start.Add(valid)
	return true
}

// undoRound gives back what a round that did not settle may have taken, and
// gives a a new value for the next round. gateOurs: the gate was ours when
// the round began.
func (q *quorum) undoRound(ctx context.Context, a *attempt, r *round, gateOurs bool) {
	// Our SET may have landed where the answer was late or lost:
	// release wherever it may have, that is wherever the round did not
	// see another holder. Announce the release if we held a majority,
	// or if we held the gate and nobody holds a majority: the waiters
	// behind us would otherwise sleep until they poll. (When someone
	// does hold a majority, its own release will wake them.)
	_, topVotes := r.top()
	heldGate := gateOurs || slices.Contains(r.ours, a.gate)
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
	// Under the node timeout, unlike a lease's release (leave): the next
	// round waits for this one, within the acquisition's wait.
	q.releaseSettled(context.WithoutCancel(ctx), q.cfg.nodeTimeout, a.pending, a.key, a.token, skip, len(r.ours) >= q.need || heldGate && topVotes < q.need)
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
}
