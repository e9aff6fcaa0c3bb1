package zklock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/flashsale/stock/lab/testzk"
)

// TestSendUnsentRepeatsWhatTheSameFlushFailed: the client fails unsent
// requests with ErrNoServer as it begins a round of connection attempts;
// a repeat queued while that flush still drains the queue fails with it.
// That is not a failed round, and the request goes again (the CI flake of
// TestLostCreateThenFailedReconnectLeavesNoOrphan: an uncontended Acquire
// gave up after a single refused dial). Once the client has announced a
// new attempt, a further ErrNoServer means a whole round failed: the call
// fails, as it must when the server is down.
func TestSendUnsentRepeatsWhatTheSameFlushFailed(t *testing.T) {
	connecting := zk.Event{Type: zk.EventSession, State: zk.StateConnecting}
	cases := []struct {
		name    string
		results []error // f's results in turn; nil sends
		between func(l *Locker, call int)
		want    error
		calls   int
	}{
		{name: "the same flush fails the repeat twice",
			results: []error{zk.ErrNoServer, zk.ErrNoServer, zk.ErrNoServer, nil},
			between: func(*Locker, int) {}, want: nil, calls: 4},
		{name: "a new round fails it",
			results: []error{zk.ErrNoServer, zk.ErrNoServer, nil},
			between: func(l *Locker, call int) {
				if call == 2 { // the next round begins before it fails the repeat
					l.onEvent(connecting)
				}
			}, want: zk.ErrNoServer, calls: 2},
		{name: "a lost connection is no unsent request",
			results: []error{zk.ErrConnectionClosed, nil},
			between: func(*Locker, int) {}, want: zk.ErrConnectionClosed, calls: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := &Locker{changed: make(chan struct{})}
			l.onEvent(connecting)
			calls := 0
			_, err := sendUnsent(l, func() (struct{}, error) {
				err := c.results[calls]
				calls++
				c.between(l, calls)
				return struct{}{}, err
			})
			if !errors.Is(err, c.want) || (c.want == nil && err != nil) || calls != c.calls {
				t.Fatalf("sendUnsent = %v after %d calls, want %v after %d", err, calls, c.want, c.calls)
			}
		})
	}
}

// TestForgetFollowsACreateIntoTheNextSession: obtain reads the session's
// generation before its create, and a create queued while that session is
// disconnected can be sent in the next session, once the first expired
// (found by review). If its answer is lost and the lookups by GUID fail,
// the abandoned node lives in the new session: forget must look for it
// there rather than give up with the old generation, or the node holds the
// lock against every process for as long as the Locker lives.
func TestForgetFollowsACreateIntoTheNextSession(t *testing.T) {
	srv := testzk.Start(t)
	l, err := New([]string{srv.Addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := l.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	name := "forget-next-session-" + newGUID()[:8]
	if err := l.ensure(ctx, name); err != nil {
		t.Fatal(err)
	}
	dir, guid := l.dir(name), newGUID()
	// The generation obtain read; then the session it stood for expired
	// and the create went out in the next one.
	gen := l.generation()
	l.mu.Lock()
	l.sessionGen++
	l.mu.Unlock()
	path, err := l.createProtected(dir, guid)
	if err != nil {
		t.Fatal(err)
	}
	// The first lookup by GUID is refused with the connection.
	var finds atomic.Int32
	l.onFind = func(err error) error {
		if finds.Add(1) == 1 {
			return zk.ErrNoServer
		}
		return err
	}
	l.forget(dir, guid, "", gen)
	exists, _, err := l.conn.Exists(path)
	if err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatalf("forget gave up on %s, created in the session after generation %d: an orphan that holds the lock (%d lookups)", path, gen, finds.Load())
	}
}
