package zklock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/go-zookeeper/zk"

	"github.com/flashsale/stock/internal/locking"
	"github.com/flashsale/stock/internal/locking/handoff"
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
	onFind   func(err error) error          // passes each lookup by GUID's error
	onToken  func(name string, token int64) // after a holder took its token, before its lease begins
	watches  atomic.Int64                   // predecessor watches that woke a waiter (its deletion, or a session change)

	mu         sync.Mutex
	closed     bool
	connected  bool          // the session is established and the connection up
	sessionGen uint64        // counts expiries: nodes of an older generation are gone
	epoch      uint64        // counts disconnections and expiries: holds of an older one are lost
	changed    chan struct{} // closed and replaced at every change of the session's state
	dials      uint64        // counts the client's connection attempts (its CONNECTING events)
	holds      map[*hold]struct{}
	names      map[string]*nameState
	idleNames  int // entries of names with no users
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
	if h, ok := locking.HoldOf[*hold](ctx, l, name); ok {
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
	// The wait ends at the caller's deadline, else after WithWait's bound,
	// or when the Locker closes.
	wctx, cancel := locking.WaitContext(ctx, 0, l.cfg.waitBound(), l.closeCtx)
	defer cancel()

	turn, err := l.queue.Wait(wctx, name, func(t handoff.Turn[*node]) { l.endTurn(wctx, name, t) })
	if err != nil {
		return nil, locking.NotObtained(wctx, l.closeCtx)
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
			return nil, locking.NotObtained(wctx, l.closeCtx, err)
		}
	}
	for {
		n, err := l.obtain(wctx, name)
		if err != nil {
			l.queue.Done(name)
			return nil, locking.NotObtained(wctx, l.closeCtx, err)
		}
		n.budget = l.queue.Waiting(name)
		le, err := l.hold(ctx, wctx, n)
		if err == nil {
			return le, nil
		}
		l.dropNode(ctx, wctx, n)
		if !errors.Is(err, errNodeGone) {
			l.queue.Done(name)
			return nil, locking.NotObtained(wctx, l.closeCtx, err)
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

// endTurn ends a turn that reached a waiter as it gave up: a handed node
// goes on to the next local waiter or is deleted.
func (l *Locker) endTurn(ctx context.Context, name string, t handoff.Turn[*node]) {
	if t.Handed {
		l.passOn(ctx, t.Hold, false)
		return
	}
	l.queue.Done(name)
}

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

// ResetAll is Reset for many names (a catalog's new sales): each name's
// chain of local hand-overs ends, and one call checks that the server
// answers, instead of one per name (10,000 names took 1.1-1.5 s).
func (l *Locker) ResetAll(ctx context.Context, names []string) error {
	if len(names) == 0 {
		return nil
	}
	for _, name := range names {
		if err := validName(name); err != nil {
			return err
		}
	}
	for _, name := range names {
		l.use(name)
		l.mu.Lock()
		l.nameLocked(name).generation++
		l.mu.Unlock()
	}
	defer func() {
		for _, name := range names {
			l.done(name)
		}
	}()
	dir := l.dir(names[0])
	_, err := call(l, ctx, func() (bool, error) {
		ok, _, err := l.conn.Exists(dir)
		return ok, err
	}, nil)
	return l.nodeError(err)
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
