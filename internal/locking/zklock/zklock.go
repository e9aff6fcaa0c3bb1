// Package zklock is STRATEGY=zk-lock's lock: a ZooKeeper lock in the style
// of Curator's InterProcessMutex, with a context on every wait, a loss
// signal, fencing tokens and a local FIFO hand-over between the goroutines
// of one process.
//
// # The recipe
//
// The lock named n is the folder <prefix>/n. A contender creates an
// ephemeral sequential node in it whose name starts with a random GUID
// ("_c_<guid>-lock-0000000042", ZooKeeper's "protected" name): if the
// create's answer is lost with the connection, the contender lists the
// folder and finds its node again by the GUID, instead of leaving an
// orphan that would hold the lock until its session ends. The node with
// the lowest sequence number holds the lock. Every other contender watches
// only the node just below its own (GetW on it), so a release wakes one
// process, not the herd; when that node goes, the contender lists the
// folder again, since its predecessor may have given up while an earlier
// node still holds (unless the predecessor was the only node below its
// own: sequence numbers only grow, so it is the lowest now).
//
// Inside one process only one goroutine per name talks to ZooKeeper: the
// others queue behind it in a handoff.Queue (first come, first served).
// A holder's Release passes its node to the next local waiter, without a
// round trip through ZooKeeper's queue, as long as its budget allows: the
// number of local waiters counted when the process got the lock from
// ZooKeeper, so that other processes queued meanwhile are served after that
// batch and not starved. Then the holder deletes its node (with its
// version: only its own) and the next in ZooKeeper's order holds.
//
// # Fencing tokens
//
// A holder that got the lock from ZooKeeper makes one write before it
// holds: a multi that checks its lock node (the node is never written, so
// version 0 means "still there": our session lives), checks the version of
// the fence node <prefix>/n/fence, whose data is a base B (0 until
// AdvanceFence raises it), and writes the process's own token node
// <prefix>/n/token-<id> (an ephemeral node nothing else touches). If the
// lock node is gone, the write fails and the would-be holder goes back to
// ZooKeeper's queue instead of holding.
//
// The token has two parts: B + z<<16 + i, where z is the multi's zxid and
// i the holder's place in its batch. The holder that wrote is place 0;
// each local hand-over gives the next holder the next place, without a
// write of its own (a batch that would pass 65,536 holders writes again).
//
// The invariant: tokens grow with every new holder. Inside a batch, i
// grows. A batch's write happens after the previous holder's (the previous
// holder deleted its node only after its own write succeeded; a waiter
// writes only after it saw that deletion), ZooKeeper orders writes by
// zxid, the multi itself checks that B at zxid z is the B it adds, and B
// only grows: a later batch's z' > z gives B' + z'<<16 > B + z<<16 + i for
// every i < 1<<16. So tokens grow strictly in every process and across
// server restarts (a restart begins a new epoch, the high half of the
// zxid). AdvanceFence(atLeast) writes this process's token node to learn
// a zxid n below every later write's, and raises B, if it must, to
// atLeast - (n+1)<<16 + 1, so every later batch's tokens are above atLeast
// (raising B to atLeast itself would add a zxid's worth of tokens at each
// call, and they would run out); this process hands on no place of an
// earlier batch at or below it (another process may: the store refuses
// it, that process advances the fence in turn, and its next holder
// writes).
//
// A hand-over without a write trusts the session: it is made only while
// the client has not lost its connection since the batch's write (the
// connection's epoch) and within a third of the session timeout of it, as
// a renewal would be; past that the next holder writes again, and that
// write fails if the node is gone. A holder handed a place after its
// session silently ended holds a token below every holder that came after
// the end, so the store refuses its writes: the token, not the belief in
// the lock, makes a late write harmless.
//
// The write goes to a node of the process's own rather than the lock node
// (a SetData there would do as well for the token) because the next
// process in line watches the lock node: a write on it would wake that
// process for nothing at every batch.
//
// Why not the node's creation zxid (czxid), as tokens often are? Because of
// the local hand-over: g1 of process P holds on P's node N, g2 of P queues
// locally, and process Q queues in ZooKeeper with node M, czxid(M) >
// czxid(N). g1 hands N to g2. With czxid as token g2 gets g1's token (a
// store that refuses equal tokens refuses g2; one that accepts them
// accepts g1's late write); with czxid(N)+1 it may equal czxid(M), Q's
// token after g2. The batch's own write, after everything its
// predecessors did, and the place in the batch give each holder a token of
// its own.
//
// # Fairness
//
// Inside a process the queue is FIFO; in ZooKeeper, the sequence numbers'
// order. A process that got the lock hands it on locally at most as many
// times as it had local waiters then; when that budget is used up it looks
// at the folder (one read, and only if it was alone when it got the lock)
// and renews the budget if no other process has queued meanwhile, else it
// deletes its node and the next process holds.
//
// # Sessions: SUSPENDED and LOST
//
// The session is part of the lock. When the client loses its connection
// (zk.StateDisconnected: Curator's SUSPENDED) a holder cannot know whether
// its session, and so its node, still lives: every lease's context is
// cancelled at once with a cause wrapping locking.ErrLockLost, and such a
// hold is never handed on. When the session expires (zk.StateExpired:
// LOST) its nodes are gone; a waiter sees its node missing and fails with a
// locking.NodeError of zk.ErrSessionExpired. The client then reconnects
// with a new session, on which later Acquires work.
//
// A paused process can still believe it holds the lock after its session
// expired: only the token, checked by the resource, makes a late write
// harmless.
package zklock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/flashsale/stock/internal/locking"
	"github.com/flashsale/stock/internal/locking/handoff"
)

// A token is B + z<<batchBits + i: the fence base B, the zxid z of the
// token write that began the holder's batch, and i, the holder's place in
// the batch (see the package documentation).
const (
	batchBits = 16
	maxBatch  = 1 << batchBits // holders per token write at most
)

const (
	protectedPrefix = "_c_" // as zk.Conn.CreateProtectedEphemeralSequential names them
	lockInfix       = "-lock-"
	fenceNode       = "fence"
)

var acl = zk.WorldACL(zk.PermAll)

// errNodeGone: our node is no longer there (its session ended).
var errNodeGone = errors.New("zklock: lock node gone")

// Locker hands out the locks of one ZooKeeper session. It is safe for
// concurrent use; use one Locker per process. It remembers a few words per
// lock name (the folder exists, the fence base, its token node) while the
// name is in use, and for the last idle names it used, at most
// WithIdleNames of them: a process that locks every SKU of a catalog once
// keeps no state for each.
type Locker struct {
	cfg      config
	conn     *zk.Conn
	addr     string // for locking.NodeError
	id       string // names this Locker's token nodes
	queue    *handoff.Queue[*node]
	closeCtx context.Context
	closeAll context.CancelFunc
	connDone chan struct{} // closed when the client's goroutines have ended
	wg       sync.WaitGroup

	// Test hooks, set before use.
	onWatch  func(node, predecessor string) // after each watch is set
	onCreate func(path string, err error) (string, error)
	watches  atomic.Int64 // predecessor watches that woke a waiter (its deletion, or a session change)

	mu         sync.Mutex
	closed     bool
	connected  bool          // the session is established and the connection up
	sessionGen uint64        // counts expiries: nodes of an older generation are gone
	epoch      uint64        // counts disconnections and expiries: holds of an older one are lost
	changed    chan struct{} // closed and replaced at every change of the session's state
	holds      map[*hold]struct{}
	names      map[string]*nameState
	idleNames  int // entries of names with no users
}

// nameState is what this process remembers of one lock, guarded by mu. It
// lives while the name has users (see use), and a while after as an idle
// name.
type nameState struct {
	// users counts the Acquires of the name in progress, the holders that
	// have not released it, and the Resets and AdvanceFences running: a
	// node of this process can be handed on only while one of them lasts.
	users      int
	ready      bool   // the folder and its fence node exist
	base       int64  // the fence node's data, as last read
	version    int32  // the fence node's version, as last read
	known      bool   // base and version are set
	generation int    // counts Resets: a hold of an older one is not handed on
	floor      int64  // AdvanceFence's highest atLeast: places handed on must be above it
	token      string // this process's token node
	tokenGen   uint64 // the session generation it was created in
}

// node is a hold on the lock as it passes from holder to holder in this
// process.
type node struct {
	name       string
	path       string // the ephemeral node, full path
	version    int32  // its data version: never written, so 0
	budget     int    // local hand-overs left
	alone      bool   // no other node was queued when the process got the lock
	generation int    // nameState.generation when the process got the lock

	// The places of the batch's last token write left for hand-overs
	// without a write of their own: nextToken up to topToken, usable
	// while the session's epoch is still epoch and the write was sent
	// less than a third of the session timeout ago.
	nextToken, topToken int64
	epoch               uint64
	written             time.Time
}

// New dials the ZooKeeper servers (host:port) and returns a Locker on its
// own session. The session is established in the background; Acquire
// waits for it. Close the Locker to close the session.
func New(servers []string, opts ...Option) (*Locker, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if !strings.HasPrefix(cfg.prefix, "/") || strings.HasSuffix(cfg.prefix, "/") {
		return nil, fmt.Errorf("zklock: prefix %q must start and must not end with /", cfg.prefix)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Locker{
		cfg:      cfg,
		addr:     strings.Join(servers, ","),
		id:       newGUID(),
		queue:    handoff.New[*node](),
		closeCtx: ctx,
		closeAll: cancel,
		connDone: make(chan struct{}),
		changed:  make(chan struct{}),
		holds:    make(map[*hold]struct{}),
		names:    make(map[string]*nameState),
	}
	dialer := cfg.dialer
	if dialer == nil {
		dialer = net.DialTimeout
	}
	conn, events, err := zk.Connect(servers, cfg.sessionTimeout, zk.WithLogger(cfg.logger), zk.WithLogInfo(false),
		zk.WithEventCallback(l.onEvent), zk.WithDialer(dialer))
	if err != nil {
		cancel()
		return nil, &locking.NodeError{Node: l.addr, Err: err}
	}
	l.conn = conn
	// The callback has the events; this drains the channel only to learn
	// when the client's goroutines have ended (it closes it last).
	go func() {
		for range events {
		}
		close(l.connDone)
	}()
	return l, nil
}

// onEvent follows the session's state. It runs on the client's goroutines
// (sometimes under the client's locks): it must not block or call the
// client.
func (l *Locker) onEvent(ev zk.Event) {
	if ev.Type != zk.EventSession {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var cause error
	switch ev.State {
	case zk.StateHasSession:
		l.connected = true
	case zk.StateDisconnected:
		if l.connected {
			l.connected = false
			l.epoch++
			cause = fmt.Errorf("%w: connection to ZooKeeper suspended", locking.ErrLockLost)
		}
	case zk.StateExpired:
		l.connected = false
		l.epoch++
		l.sessionGen++
		cause = fmt.Errorf("%w: ZooKeeper session expired", locking.ErrLockLost)
	default:
		return
	}
	if cause != nil {
		for h := range l.holds {
			h.loseLocked(cause)
		}
	}
	close(l.changed)
	l.changed = make(chan struct{})
}

// Acquire takes the lock named name (no "/" in it), waiting while it is
// held: until ctx's deadline, or for WithWait's bound (default twice the
// session timeout) if ctx has none. If ctx comes from a Lease of the same
// name and Locker, Acquire re-enters it: it returns at once with another
// Lease of the same hold and token; the lock is released with the last of
// them.
//
// A wait that ends fails with errors.Join(locking.ErrNotObtained,
// ctx.Err()), plus the last locking.NodeError if the server was failing;
// a server that cannot be reached fails it at once with a
// locking.NodeError.
func (l *Locker) Acquire(ctx context.Context, name string) (*Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(locking.ErrNotObtained, err)
	}
	if err := validName(name); err != nil {
		return nil, err
	}
	if h, ok := ctx.Value(holdKey{l, name}).(*hold); ok {
		if le := l.reenter(ctx, h); le != nil {
			return le, nil
		}
	}
	if l.isClosed() {
		return nil, errors.Join(locking.ErrNotObtained, locking.ErrClosed)
	}
	// The name's state lives until the lease is released (Release ends
	// this use), or until the acquisition fails.
	l.use(name)
	le, err := l.acquire(ctx, name)
	if err != nil {
		l.done(name)
	}
	return le, err
}

// acquire is Acquire's wait and hold, within a use of name.
func (l *Locker) acquire(ctx context.Context, name string) (*Lease, error) {
	wctx, cancel := l.waitContext(ctx)
	defer cancel()

	turn, err := l.queue.Wait(wctx, name, func(t handoff.Turn[*node]) { l.endTurn(wctx, name, t) })
	if err != nil {
		return nil, l.notObtained(wctx)
	}
	if turn.Handed {
		le, err := l.hold(ctx, wctx, turn.Hold)
		if err == nil {
			return le, nil
		}
		// The node went with the session on the way (then go to ZooKeeper
		// afresh), or the wait ended: either way delete it.
		l.dropNode(ctx, wctx, turn.Hold)
		if !errors.Is(err, errNodeGone) {
			l.queue.Done(name)
			return nil, l.notObtained(wctx, err)
		}
	}
	for {
		n, err := l.obtain(wctx, name)
		if err != nil {
			l.queue.Done(name)
			return nil, l.notObtained(wctx, err)
		}
		n.budget = l.queue.Waiting(name)
		le, err := l.hold(ctx, wctx, n)
		if err == nil {
			return le, nil
		}
		l.dropNode(ctx, wctx, n)
		if !errors.Is(err, errNodeGone) {
			l.queue.Done(name)
			return nil, l.notObtained(wctx, err)
		}
	}
}

// dropNode deletes a node that will not be held: at once while the wait
// goes on, in the background once it has ended, so that the caller comes
// back at its deadline even when the server does not answer.
func (l *Locker) dropNode(ctx, wctx context.Context, n *node) {
	if wctx.Err() == nil {
		_ = l.deleteNode(ctx, n)
		return
	}
	l.spawn(func() { _ = l.deleteNode(context.WithoutCancel(ctx), n) })
}

func validName(name string) error {
	if name == "" || strings.Contains(name, "/") || name == "." || name == ".." {
		return fmt.Errorf("zklock: invalid lock name %q", name)
	}
	return nil
}

// waitContext bounds the wait: the caller's deadline, else WithWait's
// bound. Close ends it too.
func (l *Locker) waitContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return locking.WaitContext(ctx, 0, l.cfg.waitBound(), l.closeCtx)
}

// notObtained is the error of a failed acquisition: locking.ErrNotObtained,
// the wait's error if it ended, locking.ErrClosed if Close ended it, and
// the failure that ended it (a locking.NodeError).
func (l *Locker) notObtained(wctx context.Context, errs ...error) error {
	return locking.NotObtained(wctx, l.closeCtx, errs...)
}

// endTurn ends a turn that reached a waiter as it gave up: a handed node
// goes on to the next local waiter or is deleted.
func (l *Locker) endTurn(ctx context.Context, name string, t handoff.Turn[*node]) {
	if t.Handed {
		l.passOn(ctx, t.Hold, false)
		return
	}
	l.queue.Done(name)
}

// obtain creates this process's node for name and waits until it is the
// lowest: the lock is then the process's in ZooKeeper. A wait that ends
// leaves no node behind.
func (l *Locker) obtain(wctx context.Context, name string) (*node, error) {
	dir := l.dir(name)
	if err := l.ensure(wctx, name); err != nil {
		return nil, err
	}
	guid := newGUID()
	gen := l.generation()
	// A create sent once may have been applied even if the attempt failed
	// later (its answer lost, then the lookup by GUID refused with the
	// connection): a retry looks for the node by its GUID before it
	// creates, or the first node would be left queued, an orphan of our own
	// live session that blocks the lock for everyone (found by review).
	created := false
	path, err := call(l, wctx, func() (string, error) {
		if created {
			if found, err := l.findGUID(dir, guid); err != nil || found != "" {
				return found, err
			}
		}
		created = true
		return l.createProtected(dir, guid)
	}, func(path string, err error) { l.forget(dir, guid, path, gen) })
	if err != nil {
		if transient(err) {
			// The create may have happened, its answer lost: find the
			// node by its GUID and delete it. (An abandoned call's orphan
			// function does the same.)
			l.spawn(func() { l.forget(dir, guid, "", gen) })
		}
		return nil, l.nodeError(err)
	}
	n := &node{name: name, path: path, version: 0, generation: l.nameGeneration(name)}
	if err := l.awaitTurn(wctx, n); err != nil {
		// Leave no node behind: it would hold up the next contenders. The
		// deletion runs on a goroutine of the Locker's, retried until the
		// node is gone, so that a waiter whose context ended comes back at
		// once even when the server does not answer (found by review: up to
		// half a session timeout late).
		l.spawn(func() { l.forget(dir, guid, n.path, gen) })
		return nil, err
	}
	return n, nil
}

// createProtected creates an ephemeral sequential node named with guid in
// dir. If the answer is lost with the connection, it looks for the node by
// its GUID: the create may have been applied.
func (l *Locker) createProtected(dir, guid string) (string, error) {
	prefix := dir + "/" + protectedPrefix + guid + lockInfix
	var err error
	for range 3 {
		var path string
		path, err = l.conn.Create(prefix, nil, zk.FlagEphemeral|zk.FlagSequence, acl)
		if l.onCreate != nil {
			path, err = l.onCreate(path, err)
		}
		switch {
		case err == nil:
			return path, nil
		case errors.Is(err, zk.ErrConnectionClosed):
			var found string
			found, err = l.findGUID(dir, guid)
			if err != nil || found != "" {
				return found, err
			}
		case errors.Is(err, zk.ErrSessionExpired):
			// The node, if any, went with the session: create it again.
		default:
			return "", err
		}
	}
	return "", err
}

func (l *Locker) findGUID(dir, guid string) (string, error) {
	children, _, err := l.conn.Children(dir)
	if err != nil {
		return "", err
	}
	for _, c := range children {
		if strings.HasPrefix(c, protectedPrefix+guid) {
			return dir + "/" + c, nil
		}
	}
	return "", nil
}

// forget deletes the node of an abandoned create (path, or found by its
// GUID), retrying across reconnections until it is gone, its session
// (generation gen) expired, or the Locker closed. It runs on a goroutine
// of the Locker's.
func (l *Locker) forget(dir, guid, path string, gen uint64) {
	for {
		var err error
		if path == "" {
			path, err = l.findGUID(dir, guid)
		}
		if err == nil && path != "" {
			err = l.conn.Delete(path, -1)
		}
		if err == nil || errors.Is(err, zk.ErrNoNode) || !transient(err) {
			return
		}
		if !l.awaitChange(gen) {
			return
		}
	}
}

// awaitTurn waits until n is the lowest node of its folder, watching only
// its predecessor.
func (l *Locker) awaitTurn(wctx context.Context, n *node) error {
	dir := l.dir(n.name)
	me := n.path[len(dir)+1:]
	for {
		children, err := call(l, wctx, func() ([]string, error) {
			c, _, err := l.conn.Children(dir)
			return c, err
		}, nil)
		if err != nil {
			if err = l.retryable(wctx, err); err != nil {
				return err
			}
			continue
		}
		locks := lockNodes(children)
		i := slices.Index(locks, me)
		switch {
		case i < 0:
			return &locking.NodeError{Node: l.addr, Err: fmt.Errorf("%w: %w", errNodeGone, zk.ErrSessionExpired)}
		case i == 0:
			n.alone = len(locks) == 1
			return nil
		}
		deleted, err := l.awaitDeletion(wctx, n, dir+"/"+locks[i-1])
		if err != nil {
			return err
		}
		// Sequence numbers only grow: the nodes below ours are those of
		// the listing. If the one that went was the only one, we are the
		// lowest; else list again (it may have given up while an earlier
		// one still holds).
		if deleted && i == 1 {
			return nil
		}
	}
}

// awaitDeletion watches pred until it is deleted (true) or the watch ends
// otherwise (false: the session's state changed; list again). A change of
// pred's data (its holder's token write) only re-arms the watch.
func (l *Locker) awaitDeletion(wctx context.Context, n *node, pred string) (bool, error) {
	for {
		watch, err := call(l, wctx, func() (<-chan zk.Event, error) {
			_, _, ch, err := l.conn.GetW(pred)
			return ch, err
		}, nil)
		if errors.Is(err, zk.ErrNoNode) {
			return true, nil
		}
		if err != nil {
			if err = l.retryable(wctx, err); err != nil {
				return false, err
			}
			return false, nil
		}
		if l.onWatch != nil {
			l.onWatch(n.path, pred)
		}
		select {
		case ev := <-watch:
			if ev.Type == zk.EventNodeDataChanged {
				continue
			}
			l.watches.Add(1)
			return ev.Type == zk.EventNodeDeleted, nil
		case <-wctx.Done():
			return false, wctx.Err()
		}
	}
}

// retryable decides about a failed call while waiting: a connection lost
// within the session is waited out, and so is a request the client could
// not send (ErrNoServer: a round of reconnection attempts failed; with one
// server that happens right after a disconnection), anything else ends the
// wait.
func (l *Locker) retryable(wctx context.Context, err error) error {
	if wctx.Err() != nil {
		return wctx.Err()
	}
	if !errors.Is(err, zk.ErrConnectionClosed) && !errors.Is(err, zk.ErrNoServer) {
		return l.nodeError(err)
	}
	l.mu.Lock()
	changed, connected := l.changed, l.connected
	l.mu.Unlock()
	if connected {
		return nil
	}
	select {
	case <-changed:
		return nil
	case <-wctx.Done():
		return errors.Join(wctx.Err(), l.nodeError(err))
	}
}

// lockNodes returns the lock nodes among children, lowest sequence first.
func lockNodes(children []string) []string {
	locks := make([]string, 0, len(children))
	for _, c := range children {
		if strings.HasPrefix(c, protectedPrefix) && strings.Contains(c, lockInfix) {
			locks = append(locks, c)
		}
	}
	slices.SortFunc(locks, func(a, b string) int { return strings.Compare(seq(a), seq(b)) })
	return locks
}

// seq is a node's sequence suffix: ten digits, so they sort as strings.
func seq(name string) string { return name[strings.LastIndex(name, "-")+1:] }

// hold makes n's lock this goroutine's: the token write, then a lease.
func (l *Locker) hold(ctx, wctx context.Context, n *node) (*Lease, error) {
	for {
		l.mu.Lock()
		epoch, floor := l.epoch, l.nameLocked(n.name).floor
		l.mu.Unlock()
		token := n.nextToken
		if token <= floor || token > n.topToken || n.epoch != epoch || time.Since(n.written) >= l.cfg.sessionTimeout/3 {
			// No token of the batch left, or none that can still be
			// trusted: a token write, which begins a new batch.
			sent := time.Now()
			base, z, err := l.writeToken(wctx, n)
			if err != nil {
				return nil, err
			}
			if z >= 1<<(62-batchBits) || base > math.MaxInt64-z<<batchBits-maxBatch {
				return nil, fmt.Errorf("zklock: fence base %d and zxid %#x too large to make tokens of", base, z)
			}
			token = base + z<<batchBits
			n.topToken, n.epoch, n.written = token+maxBatch-1, epoch, sent
		}
		n.nextToken = token + 1
		h := &hold{l: l, n: n, token: token, count: 1}
		h.ctx, h.cancel = context.WithCancelCause(context.WithValue(ctx, holdKey{l, n.name}, h))
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			h.cancel(locking.ErrClosed)
			return nil, locking.ErrClosed
		}
		if l.epoch != epoch {
			// The connection dropped around the write: it may have been
			// the session's last. Check again (the node tells).
			l.mu.Unlock()
			h.cancel(context.Canceled)
			if wctx.Err() != nil {
				return nil, wctx.Err()
			}
			continue
		}
		l.holds[h] = struct{}{}
		l.mu.Unlock()
		lctx, cancel := context.WithCancelCause(h.ctx)
		return &Lease{h: h, ctx: lctx, cancel: cancel}, nil
	}
}

// writeToken makes the token write for n's new holder: one multi that
// checks n's node (it is still there: our session lives), checks the fence
// node's version (its base is the one we know) and writes this process's
// token node. It returns the base and the multi's zxid.
//
// The write goes to a node of our own, not to the lock node: the next
// process watches the lock node, and a write there would wake it for
// nothing at every hand-over.
func (l *Locker) writeToken(wctx context.Context, n *node) (base, zxid int64, err error) {
	fence := l.dir(n.name) + "/" + fenceNode
	for {
		base, version, err := l.fence(wctx, n.name)
		if err != nil {
			return 0, 0, err
		}
		tok, err := l.tokenNode(wctx, n.name)
		if err != nil {
			return 0, 0, err
		}
		res, err := call(l, wctx, func() ([]zk.MultiResponse, error) {
			return l.conn.Multi(
				&zk.CheckVersionRequest{Path: n.path, Version: n.version},
				&zk.CheckVersionRequest{Path: fence, Version: version},
				&zk.SetDataRequest{Path: tok, Version: -1})
		}, nil)
		if err == nil && len(res) == 3 && res[2].Stat != nil {
			return base, res[2].Stat.Mzxid, nil
		}
		if err == nil {
			err = fmt.Errorf("zklock: unexpected multi response %+v", res)
		}
		if !errors.Is(err, zk.ErrNoNode) && !errors.Is(err, zk.ErrBadVersion) {
			if errors.Is(err, zk.ErrSessionExpired) {
				return 0, 0, errNodeGone
			}
			if err = l.retryable(wctx, err); err != nil {
				return 0, 0, err
			}
			continue
		}
		// Our lock node, the fence as we knew it, or our token node is
		// gone or changed. Which one? The lock node is never written, so
		// it is there as long as it is ours.
		ok, err := call(l, wctx, func() (bool, error) {
			ok, _, err := l.conn.Exists(n.path)
			return ok, err
		}, nil)
		if err != nil {
			if err = l.retryable(wctx, err); err != nil {
				return 0, 0, err
			}
			continue
		}
		if !ok {
			return 0, 0, errNodeGone
		}
		l.forgetFence(n.name)
	}
}

// tokenNode returns this process's token node for name, an ephemeral node
// that only its token writes touch, creating it once per session while the
// process remembers the name (it stays in ZooKeeper until the session ends:
// one per name the session took, a cost on the server, not here).
func (l *Locker) tokenNode(wctx context.Context, name string) (string, error) {
	l.mu.Lock()
	ns := l.nameLocked(name)
	if ns.token != "" && ns.tokenGen == l.sessionGen {
		defer l.mu.Unlock()
		return ns.token, nil
	}
	gen := l.sessionGen
	l.mu.Unlock()
	path := l.dir(name) + "/token-" + l.id
	_, err := call(l, wctx, func() (string, error) { return l.conn.Create(path, nil, zk.FlagEphemeral, acl) }, nil)
	if errors.Is(err, zk.ErrNoNode) {
		l.unready(name)
		if err = l.ensure(wctx, name); err != nil {
			return "", err
		}
		return l.tokenNode(wctx, name)
	}
	if err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return "", l.nodeError(err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ns = l.nameLocked(name)
	ns.token, ns.tokenGen = path, gen
	return path, nil
}

// fence returns name's fence base and version, reading the fence node if
// this process does not know them.
func (l *Locker) fence(wctx context.Context, name string) (int64, int32, error) {
	l.mu.Lock()
	ns := l.nameLocked(name)
	if ns.known {
		defer l.mu.Unlock()
		return ns.base, ns.version, nil
	}
	l.mu.Unlock()
	path := l.dir(name) + "/" + fenceNode
	type fv struct {
		data []byte
		st   *zk.Stat
	}
	r, err := call(l, wctx, func() (fv, error) {
		data, st, err := l.conn.Get(path)
		return fv{data, st}, err
	}, nil)
	if errors.Is(err, zk.ErrNoNode) {
		l.unready(name)
		if err = l.ensure(wctx, name); err != nil {
			return 0, 0, err
		}
		return l.fence(wctx, name)
	}
	if err != nil {
		return 0, 0, l.nodeError(err)
	}
	base, err := parseBase(r.data)
	if err != nil {
		return 0, 0, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ns = l.nameLocked(name)
	ns.base, ns.version, ns.known = base, r.st.Version, true
	return base, r.st.Version, nil
}

func parseBase(data []byte) (int64, error) {
	if len(data) == 0 {
		return 0, nil
	}
	b, err := strconv.ParseInt(string(data), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("zklock: fence node holds %q: %w", data, err)
	}
	return b, nil
}

// forgetFence makes the next token write read name's fence node again and
// check its token node.
func (l *Locker) forgetFence(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ns := l.nameLocked(name)
	ns.known, ns.token = false, ""
}

func (l *Locker) unready(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ns := l.nameLocked(name)
	ns.ready, ns.known, ns.token = false, false, ""
}

// nameLocked returns name's state; l.mu is held. Every caller runs within
// a use of name (use, done), so the state is there; outside one, a
// detached state keeps nothing.
func (l *Locker) nameLocked(name string) *nameState {
	if ns := l.names[name]; ns != nil {
		return ns
	}
	return &nameState{}
}

// use counts one more user of name's state (nameState.users), creating it
// if need be. Every use ends with done.
func (l *Locker) use(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch ns := l.names[name]; {
	case ns == nil:
		l.names[name] = &nameState{users: 1}
	case ns.users == 0:
		l.idleNames--
		ns.users = 1
	default:
		ns.users++
	}
}

// done ends a use of name. A state left without users stays as an idle
// name (its folder, fence base and token node stay known: a SKU bought
// again soon costs no more round trips than a busy one); once there are
// more than WithIdleNames idle names, they are all forgotten at once, so
// that each sweep is paid for by as many uses as it looks at names.
// Forgetting is safe: a name without users has no node of this process
// that could be handed on, so its Reset generation and fence floor no
// longer matter, and what it caches is read again.
func (l *Locker) done(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ns := l.names[name]
	if ns == nil || ns.users == 0 {
		return
	}
	if ns.users--; ns.users > 0 {
		return
	}
	if l.idleNames++; l.idleNames <= l.cfg.idleNames {
		return
	}
	for n, s := range l.names {
		if s.users == 0 {
			delete(l.names, n)
		}
	}
	l.idleNames = 0
}

func (l *Locker) nameGeneration(name string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nameLocked(name).generation
}

// ensure creates name's folder (and the prefix's) and its fence node, once
// per process while the process remembers the name (an existing one is
// left as it is).
func (l *Locker) ensure(wctx context.Context, name string) error {
	l.mu.Lock()
	ready := l.nameLocked(name).ready
	l.mu.Unlock()
	if ready {
		return nil
	}
	dir := l.dir(name)
	_, err := call(l, wctx, func() (struct{}, error) {
		parts := strings.Split(strings.TrimPrefix(dir, "/"), "/")
		path := ""
		for _, p := range parts {
			path += "/" + p
			if _, err := l.conn.Create(path, nil, 0, acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return struct{}{}, err
			}
		}
		_, err := l.conn.Create(dir+"/"+fenceNode, []byte("0"), 0, acl)
		if errors.Is(err, zk.ErrNodeExists) {
			err = nil
		}
		return struct{}{}, err
	}, nil)
	if err != nil {
		return l.nodeError(err)
	}
	l.mu.Lock()
	l.nameLocked(name).ready = true
	l.mu.Unlock()
	return nil
}

func (l *Locker) dir(name string) string { return l.cfg.prefix + "/" + name }

// passOn ends a holder's turn: the node goes to the next local waiter if
// the budget allows and the hold is sound, else it is deleted (only our
// own node, by its version) and the turn ends. It returns the delete's
// error: one wrapping locking.ErrLockLost if the node was gone.
func (l *Locker) passOn(ctx context.Context, n *node, lost bool) error {
	if !lost && !l.isClosed() && n.generation == l.nameGeneration(n.name) && l.queue.Waiting(n.name) > 0 {
		if n.budget == 0 && n.alone {
			n.budget = l.renewBudget(ctx, n)
		}
		if n.budget > 0 {
			next := *n
			next.budget--
			if l.queue.Pass(n.name, &next) {
				return nil
			}
		}
	}
	// Delete first, then let the next local waiter create its node: it
	// would otherwise queue behind ours and wait for its deletion.
	err := l.deleteNode(ctx, n)
	l.queue.Done(n.name)
	return err
}

// renewBudget returns a new budget of hand-overs for a batch that used its
// own up: the local waiters of now, if no other process has queued for the
// lock (n's node is the only one), else 0 and the lock goes to the others.
// A process that queues after the look waits one more batch: bounded. It
// is asked only if n was alone when the batch began: else others queue.
func (l *Locker) renewBudget(ctx context.Context, n *node) int {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.sessionTimeout/2)
	defer cancel()
	dir := l.dir(n.name)
	children, err := call(l, rctx, func() ([]string, error) {
		c, _, err := l.conn.Children(dir)
		return c, err
	}, nil)
	if err != nil {
		return 0
	}
	if locks := lockNodes(children); len(locks) != 1 || dir+"/"+locks[0] != n.path {
		n.alone = false
		return 0
	}
	return l.queue.Waiting(n.name)
}

// deleteNode deletes n, waiting for the answer at most half a session
// timeout (under context.WithoutCancel(ctx): a cancelled request never
// strands a lock). A delete that could not be done by then goes on in the
// background.
func (l *Locker) deleteNode(ctx context.Context, n *node) error {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.sessionTimeout/2)
	defer cancel()
	gen := l.generation()
	_, err := call(l, dctx, func() (struct{}, error) { return struct{}{}, l.conn.Delete(n.path, n.version) },
		func(_ struct{}, err error) {
			if transient(err) {
				l.deleteUntilGone(n.path, n.version, gen)
			}
		})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrBadVersion), errors.Is(err, zk.ErrSessionExpired):
		return fmt.Errorf("%w: %s: node %s gone: %w", locking.ErrLockLost, n.name, n.path, err)
	case errors.Is(err, locking.ErrClosed):
		return fmt.Errorf("%w: %s: %w", locking.ErrLockLost, n.name, err)
	case transient(err):
		l.spawn(func() { l.deleteUntilGone(n.path, n.version, gen) })
	}
	return l.nodeError(err)
}

// deleteUntilGone deletes path, retrying across reconnections until it is
// gone, its session (generation gen) expired or the Locker closed.
func (l *Locker) deleteUntilGone(path string, version int32, gen uint64) {
	for {
		err := l.conn.Delete(path, version)
		if !transient(err) {
			return
		}
		if !l.awaitChange(gen) {
			return
		}
	}
}

// awaitChange waits until the client is connected again, or for the next
// change of the session's state, and reports whether the nodes of
// generation gen may still exist.
func (l *Locker) awaitChange(gen uint64) bool {
	l.mu.Lock()
	changed, connected := l.changed, l.connected
	alive := l.sessionGen == gen && !l.closed
	l.mu.Unlock()
	if !alive {
		return false
	}
	if connected {
		return true // reconnected since the failure: try again now
	}
	select {
	case <-changed:
	case <-l.closeCtx.Done():
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sessionGen == gen && !l.closed
}

func (l *Locker) generation() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sessionGen
}

// transient: a call failed with the connection and may succeed after a
// reconnection in the same session.
func transient(err error) bool {
	return errors.Is(err, zk.ErrConnectionClosed) || errors.Is(err, zk.ErrNoServer) || errors.Is(err, zk.ErrSessionMoved)
}

// nodeError files a failure of the service as a locking.NodeError; a
// context's error or the Locker's closing stays what it is.
func (l *Locker) nodeError(err error) error {
	var ne *locking.NodeError
	if err == nil || errors.As(err, &ne) || errors.Is(err, locking.ErrClosed) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return &locking.NodeError{Node: l.addr, Err: err}
}

// call runs f on a goroutine of the Locker's and returns its result, or
// ctx's error if ctx ends first (go-zookeeper's calls take no context).
// The result of an abandoned call goes to orphan (if not nil), on that
// goroutine, which Close joins.
func call[T any](l *Locker, ctx context.Context, f func() (T, error), orphan func(T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	var zero T
	var mu sync.Mutex
	abandoned := false
	done := make(chan result, 1)
	if !l.spawn(func() {
		v, err := f()
		if errors.Is(err, zk.ErrNoServer) {
			// The client fails the requests it has not sent yet with
			// ErrNoServer each time it begins a round of connection
			// attempts, and with one server that is at once after every
			// disconnection. Unsent, so safe to repeat: a second one
			// means a whole round of attempts failed.
			v, err = f()
		}
		mu.Lock()
		if abandoned {
			mu.Unlock()
			if orphan != nil {
				orphan(v, err)
			}
			return
		}
		done <- result{v, err}
		mu.Unlock()
	}) {
		return zero, locking.ErrClosed
	}
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case r := <-done:
		return r.v, r.err
	default:
		abandoned = true
		return zero, ctx.Err()
	}
}

// spawn runs f on a goroutine that Close joins, unless the Locker is
// closed.
func (l *Locker) spawn(f func()) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.wg.Go(f)
	return true
}

func (l *Locker) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

func newGUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// Reset prepares name for a new sale without ever breaking a holder's
// mutual exclusion: it ends this process's chain of local hand-overs (the
// next local waiter goes back to ZooKeeper's queue) and checks that the
// server answers. It deletes no node: every lock node is an ephemeral node
// of a live session (a crashed holder's goes with its session), and
// deleting a holder's node would let a second holder in while the first
// still works. The fence node stays, so tokens keep growing.
func (l *Locker) Reset(ctx context.Context, name string) error {
	if err := validName(name); err != nil {
		return err
	}
	l.use(name)
	defer l.done(name)
	l.mu.Lock()
	l.nameLocked(name).generation++
	l.mu.Unlock()
	dir := l.dir(name)
	_, err := call(l, ctx, func() (bool, error) {
		ok, _, err := l.conn.Exists(dir)
		return ok, err
	}, nil)
	return l.nodeError(err)
}

// AdvanceFence makes every later token of name greater than atLeast: a
// store that refused a token (it saw a higher one, from a ZooKeeper whose
// data was lost and whose zxids began again) calls it. It raises the fence
// base to atLeast (never lowers it), with a version check, retried on a
// race.
func (l *Locker) AdvanceFence(ctx context.Context, name string, atLeast int64) error {
	if err := validName(name); err != nil {
		return err
	}
	if atLeast > math.MaxInt64-2*maxBatch {
		return fmt.Errorf("zklock: fence %d too high: no token is above it", atLeast)
	}
	l.use(name)
	defer l.done(name)
	// Places this process's batches have not handed on yet are not
	// handed on if they are not above atLeast: the next holder here
	// begins a new batch.
	l.mu.Lock()
	ns := l.nameLocked(name)
	ns.floor = max(ns.floor, atLeast)
	l.mu.Unlock()
	path := l.dir(name) + "/" + fenceNode
	for {
		l.forgetFence(name)
		base, version, err := l.fence(ctx, name)
		if err != nil {
			return err
		}
		// Every later batch's token is base' + z'<<batchBits with base'
		// >= base and z' above the zxid of a write made now (to this
		// process's own token node). The base is raised only as far as
		// that needs: raising it to atLeast itself would add a whole
		// zxid's worth of tokens at every call, and tokens would run out
		// after a few thousand fenced-off writes.
		now, err := l.touchToken(ctx, name)
		if err != nil {
			return err
		}
		if now >= 1<<(62-batchBits) {
			return fmt.Errorf("zklock: zxid %#x too large to make tokens of", now)
		}
		need := atLeast - (now+1)<<batchBits + 1
		if base >= need {
			return nil
		}
		_, err = call(l, ctx, func() (*zk.Stat, error) {
			return l.conn.Set(path, []byte(strconv.FormatInt(need, 10)), version)
		}, nil)
		if err == nil || !errors.Is(err, zk.ErrBadVersion) {
			l.forgetFence(name)
			return l.nodeError(err)
		}
	}
}

// touchToken writes this process's token node for name and returns the
// write's zxid: every later write's zxid is above it.
func (l *Locker) touchToken(ctx context.Context, name string) (int64, error) {
	for attempt := 0; ; attempt++ {
		tok, err := l.tokenNode(ctx, name)
		if err != nil {
			return 0, err
		}
		st, err := call(l, ctx, func() (*zk.Stat, error) { return l.conn.Set(tok, nil, -1) }, nil)
		if errors.Is(err, zk.ErrNoNode) && attempt == 0 {
			l.forgetFence(name) // the session that made it ended: make it again
			continue
		}
		if err != nil {
			return 0, l.nodeError(err)
		}
		return st.Mzxid, nil
	}
}

// Close ends waiting Acquires (locking.ErrClosed), cancels the context of
// every lease still held (ErrLockLost wrapping ErrClosed), closes the
// session (ZooKeeper deletes its nodes) and joins every goroutine the
// Locker and its client started.
func (l *Locker) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	cause := fmt.Errorf("%w: %w", locking.ErrLockLost, locking.ErrClosed)
	for h := range l.holds {
		h.loseLocked(cause)
	}
	l.mu.Unlock()
	l.closeAll()
	l.conn.Close()
	l.wg.Wait()
	<-l.connDone
	return nil
}

// holdKey marks a lease's context with its hold, for reentrancy.
type holdKey struct {
	l    *Locker
	name string
}

// hold is one holder's possession of the lock, shared by its reentrant
// leases.
type hold struct {
	l      *Locker
	n      *node
	token  int64
	ctx    context.Context
	cancel context.CancelCauseFunc
	count  int   // leases not yet released; guarded by l.mu
	lost   error // why the lock was lost; guarded by l.mu
}

func (h *hold) loseLocked(cause error) {
	if h.lost == nil {
		h.lost = cause
	}
	h.cancel(cause)
}

func (l *Locker) reenter(ctx context.Context, h *hold) *Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h.count == 0 || h.lost != nil {
		return nil
	}
	h.count++
	lctx, cancel := context.WithCancelCause(ctx)
	return &Lease{h: h, ctx: lctx, cancel: cancel}
}

// Lease is one holder's claim on a lock.
type Lease struct {
	h        *hold
	ctx      context.Context
	cancel   context.CancelCauseFunc
	released atomic.Bool
}

// Token returns the fencing token: it grows strictly with every new holder
// of the name, in every process (see the package documentation). Pass it
// to the resource the lock protects, which should refuse tokens not above
// the highest it has seen.
func (le *Lease) Token() int64 { return le.h.token }

// Context returns a context derived from Acquire's. It ends with a cause
// wrapping locking.ErrLockLost when the lock may be lost (the connection
// was suspended, the session expired, the Locker closed) and with
// context.Canceled when the lease is released. Do the protected work under
// it, and pass it to Acquire to take the same name again (reentrancy).
func (le *Lease) Context() context.Context { return le.ctx }

// Release gives the lease up. The last lease of a hold passes the lock to
// the next local waiter or deletes its node (only its own, by version;
// under context.WithoutCancel(ctx), waiting at most half a session
// timeout). It
// returns locking.ErrNotHeld for a second Release, and an error wrapping
// locking.ErrLockLost if the lock had been lost: the work under it was not
// protected to the end.
func (le *Lease) Release(ctx context.Context) error {
	if !le.released.CompareAndSwap(false, true) {
		return locking.ErrNotHeld
	}
	le.cancel(context.Canceled)
	h := le.h
	l := h.l
	l.mu.Lock()
	h.count--
	last, lost := h.count == 0, h.lost
	if last {
		delete(l.holds, h)
	}
	l.mu.Unlock()
	if !last {
		return lost
	}
	h.cancel(context.Canceled)
	err := l.passOn(ctx, h.n, lost != nil)
	l.done(h.n.name) // Acquire's use
	if lost != nil {
		return lost
	}
	return err
}

// Ping reports whether the Locker has its ZooKeeper session and a
// connection, waiting for them while ctx lasts: the readiness of a service
// that sells under this lock.
func (l *Locker) Ping(ctx context.Context) error {
	for {
		l.mu.Lock()
		connected, changed, closed := l.connected, l.changed, l.closed
		l.mu.Unlock()
		switch {
		case closed:
			return locking.ErrClosed
		case connected:
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return &locking.NodeError{Node: l.addr, Err: fmt.Errorf("no ZooKeeper session: %w", ctx.Err())}
		}
	}
}
