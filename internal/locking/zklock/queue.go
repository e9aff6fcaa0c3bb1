package zklock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/flashsale/stock/internal/backoff"
	"github.com/flashsale/stock/internal/locking"
)

// ZooKeeper's queue: a contender's protected node, and its wait behind the
// node just below it.

// obtain creates this process's node for name and waits until it is the
// lowest: the lock is then the process's in ZooKeeper. A wait that ends
// leaves no node behind. A connection lost before the node is created
// (the client failed the request, unsent, in two rounds of dials; or the
// create's answer was lost, and the node, if any, is deleted) gets
// obtainRetries more attempts, each up to two more rounds of dials (found
// in CI, under load: an Acquire gave up with "zk: could not connect to a
// server" when the connection dropped and one dial failed). No more: with
// the server gone the Acquire must fail soon with the node's error, for a
// 503, not wait out its deadline as a busy lock
// (TestServerDownIsANodeError).
func (l *Locker) obtain(wctx context.Context, name string) (*node, error) {
	var lost error // the first attempt's lost connection
	for attempt := 0; ; attempt++ {
		n, queued, err := l.obtainOnce(wctx, name)
		switch {
		case err == nil:
			return n, nil
		case lost != nil && wctx.Err() != nil && !queued:
			// The wait ended before the attempt after a lost connection
			// reached the queue: the loss is what stopped it, and the
			// answer is the node's error (a 503 unavailable), not the
			// wait's, which locking.NotObtained adds (found by review:
			// joined with the deadline, the loss was dropped, and every
			// order of an outage was answered busy). Once queued, the
			// lock was busy.
			return nil, lost
		case !transient(err) || attempt >= obtainRetries:
			return nil, err
		}
		lost = err
		// A pause that grows keeps a client that fails at once from
		// spinning.
		if perr := backoff.Wait(wctx, backoff.Exponential(attempt, 10*time.Millisecond, 100*time.Millisecond)); perr != nil {
			return nil, lost
		}
	}
}

// obtainRetries is how many more attempts obtain makes after a connection
// lost before its node was created.
const obtainRetries = 1

// obtainOnce is one attempt of obtain: a node created, and the wait for
// its turn; queued says whether the node was created.
func (l *Locker) obtainOnce(wctx context.Context, name string) (n *node, queued bool, err error) {
	dir := l.dir(name)
	if err := l.ensure(wctx, name); err != nil {
		return nil, false, err
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
		return nil, false, l.nodeError(err)
	}
	n = &node{name: name, path: path, version: 0, generation: l.nameGeneration(name)}
	if err := l.awaitTurn(wctx, n); err != nil {
		// Leave no node behind: it would hold up the next contenders. The
		// deletion runs on a goroutine of the Locker's, retried until the
		// node is gone, so that a waiter whose context ended comes back at
		// once even when the server does not answer (found by review: up to
		// half a session timeout late).
		path := n.path // n, a result, is nil by the time forget runs
		l.spawn(func() { l.forget(dir, guid, path, gen) })
		return nil, true, err
	}
	return n, true, nil
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
	if l.onFind != nil {
		err = l.onFind(err)
	}
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
// GUID), retrying across reconnections until it is gone or the Locker
// closed. It runs on a goroutine of the Locker's.
//
// gen is the session generation read before the create, which is not
// always the create's own: a create queued while that session was
// disconnected goes out in the next session once the first expired, and
// its node lives there (found by review). So when gen's session ends,
// forget does not give up: it goes on in the current session, where the
// lookup by GUID is definitive, the client sending a session's requests in
// order.
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
			l.mu.Lock()
			closed, current := l.closed, l.sessionGen
			l.mu.Unlock()
			if closed {
				return
			}
			gen = current
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

func newGUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}
