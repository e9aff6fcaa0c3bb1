package redislock

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/backoff"
)

// notifier owns one pub/sub connection to one Redis server and routes the
// messages of the wake channels to the inboxes of the waiters that armed
// them. Its goroutines start with the first subscription and are joined by
// close.
type notifier struct {
	client Client
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	ctl    chan struct{} // cap 1: the set of wanted channels changed

	mu      sync.Mutex
	ps      *redis.PubSub
	subs    map[string]*subscription
	started bool
	closed  bool
}

// subscription is the interest of one process in one channel, shared by the
// waiters of one key and counted by refs.
type subscription struct {
	n       *notifier
	channel string
	refs    int  // guarded by n.mu
	sent    bool // SUBSCRIBE sent; guarded by n.mu
	ready   chan struct{}
	isReady bool
	inboxes map[*inbox]struct{}
}

// inbox collects the wake messages of one waiter. Messages are kept, not
// just signalled, because the one that matters (our hand-over, or the release
// by the holder we lost to) may arrive while we are busy with Redis.
type inbox struct {
	c      chan struct{} // cap 1: something arrived
	mu     sync.Mutex
	msgs   []string
	resync bool // a message may have been lost: poll
}

func newInbox() *inbox { return &inbox{c: make(chan struct{}, 1)} }

func (b *inbox) deliver(payload string) {
	b.mu.Lock()
	switch {
	case payload == "":
		b.resync = true
	case len(b.msgs) < 64:
		b.msgs = append(b.msgs, payload)
	default:
		b.resync = true
	}
	b.mu.Unlock()
	select {
	case b.c <- struct{}{}:
	default:
	}
}

// take returns and clears what arrived since the last take.
func (b *inbox) take() (msgs []string, resync bool) {
	b.mu.Lock()
	msgs, resync = b.msgs, b.resync
	b.msgs, b.resync = nil, false
	b.mu.Unlock()
	return msgs, resync
}

func newNotifier(client Client) *notifier {
	ctx, cancel := context.WithCancel(context.Background())
	return &notifier{
		client: client,
		ctx:    ctx,
		cancel: cancel,
		ctl:    make(chan struct{}, 1),
		subs:   make(map[string]*subscription),
	}
}

// subscribe returns the subscription to channel, creating it (and starting
// the notifier) if needed. Release it with unsubscribe.
func (n *notifier) subscribe(channel string) *subscription {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.subs[channel]
	if s == nil {
		s = &subscription{n: n, channel: channel, ready: make(chan struct{}), inboxes: make(map[*inbox]struct{})}
		n.subs[channel] = s
	}
	s.refs++
	if !n.started && !n.closed {
		n.started = true
		n.ps = n.client.Subscribe(n.ctx)
		n.wg.Add(2)
		go n.control()
		go n.read()
	}
	n.kick()
	return s
}

func (n *notifier) unsubscribe(s *subscription) {
	n.mu.Lock()
	s.refs--
	n.mu.Unlock()
	n.kick()
}

func (n *notifier) kick() {
	select {
	case n.ctl <- struct{}{}:
	default:
	}
}

// readyC is closed once the server confirmed the subscription: a message
// published after that reaches us.
func (s *subscription) readyC() <-chan struct{} {
	s.n.mu.Lock()
	defer s.n.mu.Unlock()
	return s.ready
}

// confirmed reports whether the server has confirmed the subscription and
// the connection has not been lost since.
func (s *subscription) confirmed() bool {
	s.n.mu.Lock()
	defer s.n.mu.Unlock()
	return s.isReady
}

// awaitConfirmed waits until at least need of subs are confirmed, and
// reports whether they are; it gives up when ctx ends or bound passes.
// b must be armed on every one of subs: a confirmation signals it, so no
// confirmation slips past between a count and the wait. Signals taken here
// are lost to the caller, who looks at the lock again anyway.
//
// A Redlock waiter needs a majority, not all: a release that succeeded
// announced itself on a majority of servers, and any two majorities share
// a server, so it reaches a waiter listening on a majority. A server that
// refuses connections or hangs never confirms; waiting for it ran out
// every contended wait.
func awaitConfirmed(ctx context.Context, b *inbox, subs []*subscription, need int, bound time.Duration) bool {
	t := time.NewTimer(bound)
	defer t.Stop()
	for {
		n := 0
		for _, s := range subs {
			if s.confirmed() {
				n++
			}
		}
		if n >= need {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return false
		case <-b.c:
		}
	}
}

func (s *subscription) arm(b *inbox) {
	s.n.mu.Lock()
	s.inboxes[b] = struct{}{}
	s.n.mu.Unlock()
}

func (s *subscription) disarm(b *inbox) {
	s.n.mu.Lock()
	delete(s.inboxes, b)
	s.n.mu.Unlock()
}

// control sends SUBSCRIBE and UNSUBSCRIBE from its own goroutine, so a
// waiter never blocks on a dial to a dead server.
func (n *notifier) control() {
	defer n.wg.Done()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.ctl:
		}
		var sub, unsub []string
		n.mu.Lock()
		for ch, s := range n.subs {
			switch {
			case s.refs > 0 && !s.sent:
				s.sent = true
				sub = append(sub, ch)
			case s.refs <= 0:
				delete(n.subs, ch)
				if s.sent {
					unsub = append(unsub, ch)
				}
			}
		}
		n.mu.Unlock()
		// Errors need no handling here: go-redis remembers the channels and
		// subscribes again on its next connection, and the reader wakes the
		// waiters to poll meanwhile. Each call is bounded: a hung server
		// must not hold this goroutine (and the connection's lock, which
		// the reader needs) for as long as the client's timeouts allow.
		if len(unsub) > 0 {
			n.call(func(ctx context.Context) error { return n.ps.Unsubscribe(ctx, unsub...) })
		}
		if len(sub) > 0 {
			n.call(func(ctx context.Context) error { return n.ps.Subscribe(ctx, sub...) })
		}
	}
}

// controlTimeout bounds one SUBSCRIBE or UNSUBSCRIBE. It only has to end a
// call to a hung server: the waiters do not wait for it (awaitConfirmed).
const controlTimeout = time.Second

func (n *notifier) call(f func(ctx context.Context) error) {
	ctx, cancel := context.WithTimeout(n.ctx, controlTimeout)
	defer cancel()
	_ = f(ctx)
}

// read receives messages until close. After a connection error every
// subscription is marked not ready and every waiter told to poll, because
// messages may have been lost; go-redis resubscribes on reconnect, and the
// confirmation makes the subscription ready again.
func (n *notifier) read() {
	defer n.wg.Done()
	wait := 5 * time.Millisecond
	for {
		msg, err := n.ps.ReceiveTimeout(n.ctx, 10*time.Second)
		if n.ctx.Err() != nil {
			return
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				// Idle: a ping checks that the connection is still alive.
				_ = n.ps.Ping(n.ctx)
				continue
			}
			n.lost()
			if backoff.Wait(n.ctx, wait) != nil {
				return
			}
			wait = min(2*wait, 500*time.Millisecond)
			continue
		}
		wait = 5 * time.Millisecond
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				n.confirmed(m.Channel)
			}
		case *redis.Message:
			n.dispatch(m.Channel, m.Payload)
		}
	}
}

func (n *notifier) confirmed(channel string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.subs[channel]
	if s == nil || s.isReady {
		return
	}
	s.isReady = true
	close(s.ready)
	// Waiters that polled before this point may have missed a message.
	for b := range s.inboxes {
		b.deliver("")
	}
}

func (n *notifier) dispatch(channel, payload string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if s := n.subs[channel]; s != nil {
		for b := range s.inboxes {
			b.deliver(payload)
		}
	}
}

func (n *notifier) lost() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, s := range n.subs {
		if !s.isReady {
			// Never confirmed: its waiters are polling already.
			continue
		}
		s.isReady = false
		s.ready = make(chan struct{})
		for b := range s.inboxes {
			b.deliver("")
		}
	}
}

func (n *notifier) close() error {
	n.mu.Lock()
	n.closed = true
	ps := n.ps
	n.mu.Unlock()
	n.cancel()
	var err error
	if ps != nil {
		if cerr := ps.Close(); cerr != nil && !errors.Is(cerr, redis.ErrClosed) {
			err = cerr
		}
	}
	n.wg.Wait()
	return err
}
