package zklock

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/go-zookeeper/zk"

	"github.com/flashsale/stock/internal/locking"
)

// The session and its connection: their events (SUSPENDED, LOST), the
// waits for a reconnection, and the calls to the client, each on a
// goroutine that Close joins.

// onEvent follows the session's state. It runs on the client's goroutines
// (sometimes under the client's locks): it must not block or call the
// client.
func (l *Locker) onEvent(ev zk.Event) {
	if ev.Type != zk.EventSession {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if ev.State == zk.StateConnecting {
		// The client announces each attempt before it fails its unsent
		// requests with ErrNoServer (at the start of a round): see
		// sendUnsent.
		l.dials++
		return
	}
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
		v, err := sendUnsent(l, f)
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

// sendUnsent runs f, and again when the client failed it unsent
// (zk.ErrNoServer), until a whole round of connection attempts has failed
// since the first failure. The client fails the requests it has not sent
// yet with ErrNoServer each time it begins a round of attempts, and with
// one server that is at once after every disconnection; unsent, they are
// safe to repeat. A repeat can land in the queue before that same flush
// has emptied it and fail with it: that is no new round (no attempt was
// announced since), so it is sent again (found in CI: an uncontended
// Acquire gave up after a single refused dial).
func sendUnsent[T any](l *Locker, f func() (T, error)) (T, error) {
	v, err := f()
	if !errors.Is(err, zk.ErrNoServer) {
		return v, err
	}
	round := l.dialsSoFar()
	for range maxSameFlush {
		v, err = f()
		if !errors.Is(err, zk.ErrNoServer) || l.dialsSoFar() != round {
			return v, err
		}
	}
	return v, err
}

// maxSameFlush bounds the repeats that one flush of the client's queue
// fails: each is a request sent while the flush still drains the queue.
const maxSameFlush = 8

func (l *Locker) dialsSoFar() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dials
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
