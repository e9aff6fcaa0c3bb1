package redislock

import (
	"context"
	"hash/fnv"
	"maps"
	"slices"
	"time"
)

// gateEntry is an attempt's standing at its key's gate; only Redlock's
// attempts have one.
type gateEntry struct {
	queueID string // our name in the gate's queue; token changes after a failed round, this does not
	gate    int    // the node that served as the gate at our last look (quorum.gateFor)
	gates   []int  // every node a gate call with token went to, answered or not (leaveGateQueue retires token there)
}

// gateID names a in the gate's queue: the token it started with.
func (a *attempt) gateID() string {
	if a.queueID != "" {
		return a.queueID
	}
	return a.token
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
