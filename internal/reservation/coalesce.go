package reservation

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// errNotSent: the order's deadline ended while its script still waited
// for a pipeline, so it never reached Redis and took nothing.
var errNotSent = errors.New("the order's deadline ended before its script was sent to Redis")

// coalescer sends the reserve scripts of one SKU's orders that arrive
// together in one pipeline: one write and one read for many orders instead
// of a round trip each, in the service and in Redis (one read, one AOF
// write and one fsync for the lot). It is the group commit of the batched
// strategy, without a goroutine of its own:
//
//   - Each SKU has its own line, so a pipeline holds the scripts of one
//     SKU only and goes to one server: on Redis Cluster an order never
//     waits for another master (a hung master stalls its own SKUs, as it
//     would without pipelines).
//   - A caller that finds fewer than max pipelines of its SKU in flight
//     sends its own script with the oldest queued ones (it leads). A caller
//     sends only a pipeline that carries its own script, so its answer
//     never waits on more than that pipeline.
//   - When a pipeline returns and the line has filled again, the lead goes
//     to the oldest queued caller; one whose script another pipeline has
//     already taken, or that is leaving, passes it on.
//   - A pipeline runs until the latest deadline of the orders in it (not
//     the leader's own: leaving must not fail the others' orders), so no
//     pipeline outlives all of its callers.
type coalescer struct {
	rdb      redis.UniversalClient
	max      int // pipelines in flight per SKU at most
	maxBatch int // scripts in one pipeline at most
	replicas replicaWaiter

	mu    sync.Mutex
	lines map[string]*line // by SKU; a line at rest is removed

	// changed, when set (by tests), gets a value after each change of a
	// queue or of the leaders, if it has room.
	changed chan struct{}
}

// line is one SKU's queue, guarded by the coalescer's mutex.
type line struct {
	queue   []*scriptCall
	leaders int // callers sending a pipeline, or told to
}

// scriptCall is one order's script: what to send, and its answer.
type scriptCall struct {
	keys     []string
	args     []any
	deadline time.Time // zero: none

	reply []string
	err   error
	done  chan struct{} // closed once reply and err are set

	// Under the coalescer's mutex:
	queued  bool          // still in the queue, not yet sent
	owesRun bool          // told to lead and has not acted on it
	lead    chan struct{} // gets a value when told to lead
}

// replicaWaiter is the Store's WAIT for its replicas (replicas.go).
type replicaWaiter interface {
	waitsForReplicas() bool
	waitReplicas(ctx context.Context, p redis.Pipeliner) *replicaWait
	replicated(w *replicaWait, reply []string, err error) error
}

func newCoalescer(rdb redis.UniversalClient, pipelines int, replicas replicaWaiter) *coalescer {
	return &coalescer{rdb: rdb, max: pipelines, maxBatch: 256, lines: make(map[string]*line), replicas: replicas}
}

func (c *coalescer) changedLocked() {
	if c.changed != nil {
		select {
		case c.changed <- struct{}{}:
		default:
		}
	}
}

// run sends the reserve script of an order for sku with keys and args, in
// a pipeline with whatever other orders of sku are waiting, and returns
// its reply. An error after the script was sent may mean it ran (as for a
// single call); errNotSent means it did not.
func (c *coalescer) run(ctx context.Context, sku string, keys []string, args []any) ([]string, error) {
	call := &scriptCall{keys: keys, args: args, done: make(chan struct{}), lead: make(chan struct{}, 1), queued: true}
	call.deadline, _ = ctx.Deadline()
	c.mu.Lock()
	ln := c.lines[sku]
	if ln == nil {
		ln = &line{}
		c.lines[sku] = ln
	}
	ln.queue = append(ln.queue, call)
	leading := ln.leaders < c.max
	if leading {
		ln.leaders++
	}
	c.changedLocked()
	c.mu.Unlock()
	if leading {
		c.takeTurn(ctx, sku, ln, call)
	}
	for {
		select {
		case <-call.done:
			// Answered in another leader's pipeline, perhaps after being
			// told to lead: pass that lead on.
			c.mu.Lock()
			if call.owesRun {
				call.owesRun = false
				c.handOnLocked(sku, ln)
			}
			c.mu.Unlock()
			return call.reply, call.err
		case <-call.lead:
			c.mu.Lock()
			call.owesRun = false
			c.mu.Unlock()
			c.takeTurn(ctx, sku, ln, call)
		case <-ctx.Done():
			c.mu.Lock()
			notSent := call.queued
			if notSent {
				ln.queue = deleteCall(ln.queue, call)
				call.queued = false
				c.changedLocked()
			}
			if call.owesRun {
				// Told to lead but leaving: pass the lead on, or the
				// queue would wait for a caller that is gone.
				call.owesRun = false
				c.handOnLocked(sku, ln)
			}
			c.mu.Unlock()
			if notSent {
				return nil, errNotSent
			}
			select {
			case <-call.done:
				// The answer came with the deadline: it is the outcome.
				return call.reply, call.err
			default:
				// In a pipeline: it may run, and its answer is dropped.
				// The caller takes this for a lost answer.
				return nil, context.Cause(ctx)
			}
		}
	}
}

// takeTurn is one turn of a leader: if self's script still waits, it goes in
// one pipeline with the oldest queued scripts, each gets its answer, and
// the lead passes to the oldest queued caller or is given up. A leader
// whose script another pipeline has taken passes the lead on at once.
func (c *coalescer) takeTurn(ctx context.Context, sku string, ln *line, self *scriptCall) {
	c.mu.Lock()
	if !self.queued {
		c.handOnLocked(sku, ln)
		c.mu.Unlock()
		return
	}
	batch := make([]*scriptCall, 0, min(len(ln.queue), c.maxBatch))
	rest := ln.queue[:0]
	others := 0
	for _, call := range ln.queue {
		// The oldest, keeping room for self wherever it stands.
		if call == self || others < c.maxBatch-1 {
			if call != self {
				others++
			}
			batch = append(batch, call)
			call.queued = false
		} else {
			rest = append(rest, call)
		}
	}
	clear(ln.queue[len(rest):])
	ln.queue = rest
	c.changedLocked()
	c.mu.Unlock()

	pctx, cancel := pipelineContext(ctx, batch)
	c.send(pctx, batch)
	cancel()

	c.mu.Lock()
	c.handOnLocked(sku, ln)
	c.mu.Unlock()
}

// pipelineContext is ctx without its cancellation (a leader that gives up
// must not fail the others' orders), ending at the latest deadline in
// batch, or never if one has none (go-redis' socket timeouts bound it).
func pipelineContext(ctx context.Context, batch []*scriptCall) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, call := range batch {
		if call.deadline.IsZero() {
			return context.WithCancel(context.WithoutCancel(ctx))
		}
		if call.deadline.After(latest) {
			latest = call.deadline
		}
	}
	return context.WithDeadline(context.WithoutCancel(ctx), latest)
}

// handOnLocked ends a turn of leading sku's line: the oldest queued caller
// leads next, or there is one leader less. A line at rest is forgotten.
func (c *coalescer) handOnLocked(sku string, ln *line) {
	defer c.changedLocked()
	if len(ln.queue) > 0 && !ln.queue[0].owesRun {
		next := ln.queue[0]
		next.owesRun = true
		next.lead <- struct{}{}
		return
	}
	// Nobody waits, or the oldest was told already (by another turn that
	// ended): the lead cannot go twice to one caller, so this one ends.
	ln.leaders--
	if ln.leaders == 0 && len(ln.queue) == 0 && c.lines[sku] == ln {
		delete(c.lines, sku)
	}
}

// send runs batch in one pipeline and hands each script its answer.
// One WAIT after the scripts covers them all (replicas.go): the
// pipeline's scripts run on one connection, in order.
func (c *coalescer) send(ctx context.Context, batch []*scriptCall) {
	if len(batch) == 1 && !c.replicas.waitsForReplicas() {
		call := batch[0]
		call.reply, call.err = reserveScript.EvalSha(ctx, c.rdb, call.keys, call.args...).StringSlice()
		close(call.done)
		return
	}
	pipe := c.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(batch))
	for i, call := range batch {
		cmds[i] = reserveScript.EvalSha(ctx, pipe, call.keys, call.args...)
	}
	wait := c.replicas.waitReplicas(ctx, pipe)
	// Exec's error is the first command's; each command has its own.
	_, _ = pipe.Exec(ctx)
	for i, call := range batch {
		call.reply, call.err = cmds[i].StringSlice()
		call.err = c.replicas.replicated(wait, call.reply, call.err)
		close(call.done)
	}
}

func deleteCall(queue []*scriptCall, call *scriptCall) []*scriptCall {
	for i, q := range queue {
		if q == call {
			copy(queue[i:], queue[i+1:])
			queue[len(queue)-1] = nil
			return queue[:len(queue)-1]
		}
	}
	return queue
}
