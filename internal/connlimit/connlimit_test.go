package connlimit_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/connlimit"
)

// wait bounds every wait of these tests: a server on 127.0.0.1 answers in
// milliseconds, so reaching it means something is stuck.
const wait = 10 * time.Second

// observer forwards the Listener's events, in order, to a channel.
type observer struct{ events chan string }

func (o observer) ConnOpened()            { o.events <- "opened" }
func (o observer) ConnClosed()            { o.events <- "closed" }
func (o observer) ConnEvicted()           { o.events <- "evicted" }
func (o observer) ConnRefused(how string) { o.events <- "refused " + how }

// expect waits for the next event and checks it.
func (o observer) expect(t *testing.T, want string) {
	t.Helper()
	select {
	case got := <-o.events:
		if got != want {
			t.Fatalf("event %q, want %q", got, want)
		}
	case <-time.After(wait):
		t.Fatalf("no event after %s, want %q", wait, want)
	}
}

// server is an http.Server behind a connlimit.Listener on 127.0.0.1. Its
// handler answers "over" to a request over the cap (and closes that
// connection, as internal/httpapi does), "ok" to the others.
type server struct {
	addr string
	obs  observer
	idle chan struct{} // a connection became idle
}

func startServer(t *testing.T, maxConns int, opts ...connlimit.Option) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{addr: ln.Addr().String(), obs: observer{make(chan string, 1024)}, idle: make(chan struct{}, 1024)}
	opts = append([]connlimit.Option{connlimit.WithObserver(s.obs), connlimit.WithLogger(slog.New(slog.DiscardHandler))}, opts...)
	l := connlimit.New(ln, maxConns, opts...)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if connlimit.OverCap(r.Context()) {
				w.Header().Set("Connection", "close")
				_, _ = io.WriteString(w, "over")
				return
			}
			_, _ = io.WriteString(w, "ok")
		}),
		ConnContext: l.ConnContext,
		ConnState: func(c net.Conn, state http.ConnState) {
			l.ConnState(c, state)
			if state == http.StateIdle {
				s.idle <- struct{}{}
			}
		},
		ReadHeaderTimeout: time.Minute, // silent connections stay for the whole test
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		_ = srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	})
	return s
}

// client is one keep-alive connection to the server.
type client struct {
	net.Conn
	r *bufio.Reader
}

// dial opens a connection and sends nothing yet.
func (s *server) dial(t *testing.T) *client {
	t.Helper()
	c, err := net.DialTimeout("tcp", s.addr, wait)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &client{Conn: c, r: bufio.NewReader(c)}
}

// get sends GET / on c and returns the body of the answer.
func (c *client) get(t *testing.T) string {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(wait))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// closedByServer checks that the server closes c: its next read ends
// (EOF or reset) before the deadline.
func (c *client) closedByServer(t *testing.T) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(wait))
	n, err := c.r.Read(make([]byte, 1))
	var netErr net.Error
	if err == nil || (errors.As(err, &netErr) && netErr.Timeout()) {
		t.Fatalf("connection still open after %s (read %d bytes, %v)", wait, n, err)
	}
}

// TestLongestIdleConnectionMakesRoom: at the cap, a new connection is
// served as usual and the connection idle the longest is closed for it;
// the other idle connection keeps working.
func TestLongestIdleConnectionMakesRoom(t *testing.T) {
	s := startServer(t, 2)
	oldest := s.dial(t)
	if got := oldest.get(t); got != "ok" {
		t.Fatalf("first connection: %q", got)
	}
	<-s.idle
	s.obs.expect(t, "opened")
	younger := s.dial(t)
	if got := younger.get(t); got != "ok" {
		t.Fatalf("second connection: %q", got)
	}
	<-s.idle
	s.obs.expect(t, "opened")

	newcomer := s.dial(t)
	if got := newcomer.get(t); got != "ok" {
		t.Errorf("the connection over the cap got %q, want it served as usual", got)
	}
	s.obs.expect(t, "evicted")
	oldest.closedByServer(t)
	if got := younger.get(t); got != "ok" {
		t.Errorf("the younger idle connection: %q", got)
	}
}

// TestOverCapServedForOperatorsThenClosed: at the cap with no connection
// idle (the one there has sent nothing yet, and is no victim: its request
// may be on its way), the next connection is accepted in the headroom and
// marked over the cap; beyond the headroom connections are closed at once.
// A connection that closes gives its place back.
func TestOverCapServedForOperatorsThenClosed(t *testing.T) {
	s := startServer(t, 1, connlimit.WithHeadroom(1))
	silent := s.dial(t)
	s.obs.expect(t, "opened")
	// The kernel queues connections in the order they were made and the
	// server accepts them in that order: no wait is needed between dials.
	headroom := s.dial(t)
	beyond := s.dial(t)
	s.obs.expect(t, "opened")
	s.obs.expect(t, "refused "+connlimit.RefusedOperatorOnly)
	s.obs.expect(t, "refused "+connlimit.RefusedClosed)
	beyond.closedByServer(t)

	if got := headroom.get(t); got != "over" {
		t.Errorf("the connection in the headroom got %q, want it marked over the cap", got)
	}
	headroom.closedByServer(t)
	s.obs.expect(t, "closed")

	// The headroom's place is free again; the cap's is still the silent
	// connection's.
	again := s.dial(t)
	s.obs.expect(t, "opened")
	s.obs.expect(t, "refused "+connlimit.RefusedOperatorOnly)
	if got := again.get(t); got != "over" {
		t.Errorf("a new connection while the cap is held: %q, want over", got)
	}
	if got := silent.get(t); got != "ok" {
		t.Errorf("the silent connection, at last speaking: %q", got)
	}

	// The client hangs up: its place is given back and the next
	// connection is served as usual.
	_ = silent.Close()
	for _, want := range []string{"closed", "closed"} { // again's and silent's, in some order
		s.obs.expect(t, want)
	}
	if got := s.dial(t).get(t); got != "ok" {
		t.Errorf("after the holder left: %q, want ok", got)
	}
}

// TestCapIsLoggedOnce: many connections over the cap make one log line,
// not one each.
func TestCapIsLoggedOnce(t *testing.T) {
	var logged syncBuffer
	s := startServer(t, 1, connlimit.WithHeadroom(0), connlimit.WithLogger(slog.New(slog.NewJSONHandler(&logged, nil))))
	s.dial(t)
	var refused []*client
	for range 20 {
		refused = append(refused, s.dial(t))
	}
	for _, c := range refused {
		// Each refusal is logged, or not, before its connection is closed.
		c.closedByServer(t)
	}
	lines := strings.Count(logged.String(), "connection cap reached")
	if lines != 1 {
		t.Errorf("%d log lines about the cap, want 1:\n%s", lines, logged.String())
	}
	if !strings.Contains(logged.String(), `"max_conns":1`) {
		t.Errorf("the line does not give the cap: %s", logged.String())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// ExampleNew: one client holds the only place with a connection that says
// nothing; a buyer is refused, the probe is served.
func ExampleNew() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	l := connlimit.New(ln, 1, connlimit.WithHeadroom(2), connlimit.WithLogger(slog.New(slog.DiscardHandler)))
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if connlimit.OverCap(r.Context()) {
				w.Header().Set("Connection", "close") // free the headroom
				if r.URL.Path != "/healthz" {
					http.Error(w, "too many connections", http.StatusServiceUnavailable)
					return
				}
			}
			fmt.Fprintln(w, "ok")
		}),
		ConnState:   l.ConnState,
		ConnContext: l.ConnContext,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	defer func() {
		_ = srv.Close()
		<-served
	}()

	holder, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer holder.Close()
	for _, path := range []string{"/orders", "/healthz"} {
		resp, err := http.Get("http://" + ln.Addr().String() + path)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		fmt.Println(path, resp.StatusCode)
	}
	// Output:
	// /orders 503
	// /healthz 200
}
