package zklock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/flashsale/stock/internal/locking"
)

// Fencing tokens (see the package documentation): the token a holder
// takes, the token write that begins a batch, and AdvanceFence.

// takeToken returns the token of n's next holder, with epoch the
// connection's epoch and floor the name's fence floor (AdvanceFence's
// highest atLeast), both read before.
//
// A place of n's batch is handed on without a write only while the
// client has not lost its connection since the batch's write (a
// disconnection may have been the session's end), and locking.Batch
// hands it only above floor and within a third of the session timeout of
// the write, as a renewal would be. Otherwise, with no token of the batch
// left or none that can still be trusted: a token write, which begins a
// new batch (and fails if n's node is gone).
func (l *Locker) takeToken(wctx context.Context, n *node, epoch uint64, floor int64) (int64, error) {
	if n.epoch == epoch {
		if token, ok := n.batch.Next(floor, l.cfg.sessionTimeout/3); ok {
			return token, nil
		}
	}
	sent := time.Now()
	base, z, err := l.writeToken(wctx, n)
	if err != nil {
		return 0, err
	}
	token, err := n.batch.Begin(base, z, sent)
	if err != nil {
		return 0, fmt.Errorf("zklock: %s: %w", n.name, err)
	}
	n.epoch = epoch
	return token, nil
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

// AdvanceFence makes every later token of name greater than atLeast: a
// store that refused a token (it saw a higher one, from a ZooKeeper whose
// data was lost and whose zxids began again) calls it. It raises the fence
// base to atLeast (never lowers it), with a version check, retried on a
// race.
func (l *Locker) AdvanceFence(ctx context.Context, name string, atLeast int64) error {
	if err := validName(name); err != nil {
		return err
	}
	// The bound BaseAbove checks below, checked before anything is
	// written: a floor past it would leave no place to hand on.
	if _, err := locking.BaseAbove(atLeast, 0); err != nil {
		return fmt.Errorf("zklock: %s: %w", name, err)
	}
	l.use(name)
	defer l.done(name)
	path := l.dir(name) + "/" + fenceNode
	for {
		l.forgetFence(name)
		base, version, err := l.fence(ctx, name)
		if err != nil {
			return err
		}
		// Every later batch's token is base' + z'<<locking.PlaceBits with
		// base' >= base and z' above the zxid of a write made now (to this
		// process's own token node): BaseAbove raises the base only as far
		// as that needs.
		now, err := l.touchToken(ctx, name)
		if err != nil {
			return err
		}
		need, err := locking.BaseAbove(atLeast, now+1)
		if err != nil {
			return fmt.Errorf("zklock: %s: %w", name, err)
		}
		if base >= need {
			l.raiseFloor(name, atLeast)
			return nil
		}
		_, err = call(l, ctx, func() (*zk.Stat, error) {
			return l.conn.Set(path, []byte(strconv.FormatInt(need, 10)), version)
		}, nil)
		if err == nil {
			l.forgetFence(name)
			l.raiseFloor(name, atLeast)
			return nil
		}
		if !errors.Is(err, zk.ErrBadVersion) {
			l.forgetFence(name)
			return l.nodeError(err)
		}
	}
}

// raiseFloor makes this process hand on no place of name at or below
// atLeast, and begin no lease with such a token (hold): the next holder
// here takes its batch's first place above it (every place of a batch is
// below every later batch's tokens, so skipping places keeps tokens
// growing), or begins a new batch if it has none.
//
// AdvanceFence raises the floor once the fence base is raised, not before:
// a holder that finds its token at or below the floor takes another, and a
// token write after the floor was raised must land above it. Raised
// first, the floor would send every holder that writes meanwhile round
// again for nothing, and, were the base never raised (AdvanceFence
// failed), for as long as this process remembers the name.
func (l *Locker) raiseFloor(name string, atLeast int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ns := l.nameLocked(name)
	ns.floor = max(ns.floor, atLeast)
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
