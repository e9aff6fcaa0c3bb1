package zklock

import (
	"errors"
	"testing"

	"github.com/go-zookeeper/zk"
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
