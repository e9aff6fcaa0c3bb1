package reservation

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// connTo is a connection whose only use here is its remote address.
type connTo struct {
	net.Conn
	remote string
}

func (c connTo) RemoteAddr() net.Addr {
	return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(c.remote))
}

// serverSaid is an error reply of the server (go-redis' redis.Error).
type serverSaid string

func (e serverSaid) Error() string { return string(e) }
func (serverSaid) RedisError()     {}

const twoOnline = "# Replication\r\nrole:master\r\nslave0:ip=127.0.0.1,port=7001,state=online,offset=1,lag=0\r\nslave1:ip=127.0.0.1,port=7002,state=online,offset=1,lag=0\r\n"

// Found by review: a pipeline sized from the old primary's count, whose
// INFO (two replicas online) is read after the client has connected to the
// promoted replica, must not put the old count back over the reset that
// connection made: every WAIT on the new primary would ask for two
// replicas of its one and wait its timeout out.
func TestACountFromAServerLeftBehindDoesNotUndoTheNewServersReset(t *testing.T) {
	s := &Store{replicas: 1}
	WithReplicas(1, time.Second)(s)
	hook := &recountOnNewServer{s: s}
	dialTo := func(server string) {
		dial := hook.DialHook(func(context.Context, string, string) (net.Conn, error) {
			return connTo{remote: server}, nil
		})
		if _, err := dial(context.Background(), "tcp", "FailoverClient"); err != nil {
			t.Fatal(err)
		}
	}
	dialTo("127.0.0.1:6001")
	s.countFrom(s.online.Load(), twoOnline, nil)
	if n := s.online.Load().n; n != 2 {
		t.Fatalf("the count from the first primary's INFO is %d, want 2", n)
	}
	sizedFrom := s.online.Load() // a pipeline in flight on the old primary
	dialTo("127.0.0.1:6001")     // another connection to the same server keeps the count
	if s.online.Load() != sizedFrom {
		t.Fatal("a second connection to the same server reset the count")
	}
	dialTo("127.0.0.1:6002") // the promoted replica
	if n := s.online.Load().n; n != -1 {
		t.Fatalf("after a connection to another server the count is %d, want unknown (-1)", n)
	}
	s.countFrom(sizedFrom, twoOnline, nil) // the old pipeline's INFO lands late
	if n := s.online.Load().n; n != -1 {
		t.Fatalf("the old primary's late INFO put the count back to %d, want it unknown (-1)", n)
	}
}

// Only a lost connection makes the count unknown; a buyer who gives up
// (cancel, deadline, a timed-out read) or a busy pool says nothing about
// the server, and the server's own errors are answers from it (found by
// review: every cancelled order then made the next WAIT ask for n alone,
// and a healthy pair of replicas answered 503).
func TestOnlyALostConnectionMakesTheReplicaCountUnknown(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	timedOut := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	for _, c := range []struct {
		err  error
		lost bool
	}{
		{io.EOF, true},
		{refused, true},
		{fmt.Errorf("wrapped: %w", io.ErrUnexpectedEOF), true},
		{nil, false},
		{context.Canceled, false},
		{context.DeadlineExceeded, false},
		{timedOut, false},
		{redis.ErrPoolTimeout, false},
		{redis.Nil, false},
		{serverSaid("NOSCRIPT No matching script"), false},
		{fmt.Errorf("wrapped: %w", serverSaid("LOADING")), false},
	} {
		if got := lostConnection(c.err); got != c.lost {
			t.Errorf("lostConnection(%v) = %v, want %v", c.err, got, c.lost)
		}
	}
}
