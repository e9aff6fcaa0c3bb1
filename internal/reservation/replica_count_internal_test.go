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

// Found by review: a WAIT counts up to its connection's last write, and
// after a probe the primary refused (NOREPLICAS under
// min-replicas-to-write, OOM at maxmemory) that is an earlier write. On
// Redis 7.2 and later a retried start that wrote nothing would then be
// confirmed at once by replicas that lack its load (Debian's 7.0 moves
// the offset on every command, so a live server cannot show it here): a
// refused probe confirms nothing, whatever the WAIT answered.
func TestARefusedProbeConfirmsNothing(t *testing.T) {
	s := &Store{}
	WithReplicas(1, time.Second)(s)
	s.online.Store(&replicaCount{n: 2}) // known: no INFO asked first
	p := &recordingPipeliner{}
	w := s.awaitReadsReplicated(context.Background(), p)
	if w == nil || w.probe == nil {
		t.Fatal("no probe queued before the WAIT")
	}
	w.probe.SetErr(serverSaid("NOREPLICAS Not enough good replicas to write."))
	w.wait.SetVal(2)
	w.info.SetVal(twoOnline)
	if err := s.confirmed(w); err == nil {
		t.Fatal("a WAIT after a refused probe was confirmed")
	}
	w.probe.SetErr(nil)
	if err := s.confirmed(w); err != nil {
		t.Fatalf("the same WAIT after a probe that was taken: %v", err)
	}
}

// recordingPipeliner queues commands and sends none.
type recordingPipeliner struct {
	redis.Pipeliner
	cmds []redis.Cmder
}

func (p *recordingPipeliner) Process(_ context.Context, c redis.Cmder) error {
	p.cmds = append(p.cmds, c)
	return nil
}

func (p *recordingPipeliner) Set(ctx context.Context, key string, v any, d time.Duration) *redis.StatusCmd {
	c := redis.NewStatusCmd(ctx, "set", key, v)
	_ = p.Process(ctx, c)
	return c
}

func (p *recordingPipeliner) Info(ctx context.Context, section ...string) *redis.StringCmd {
	c := redis.NewStringCmd(ctx, "info", section[0])
	_ = p.Process(ctx, c)
	return c
}
