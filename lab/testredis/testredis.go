// Package testredis runs real redis-server processes for tests: each on a
// free 127.0.0.1 port, without persistence unless asked (StartDurable), so a
// restart comes back empty; stopped by its own PID. It never touches a
// Redis it did not start.
//
// Without the redis-server binary a test skips, except under CI=true, where
// it fails: CI must never pass because a server was missing.
package testredis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/lab/testproc"
)

// Bin is where Debian's redis-server package puts the server.
const Bin = "/usr/bin/redis-server"

// ErrNoRedis means the redis-server binary is missing.
var ErrNoRedis = errors.New("redis-server not found")

// Server is a redis-server child process on a free loopback port,
// without persistence unless started with StartDurable.
type Server struct {
	Addr string
	port int
	dir  string
	args []string // extra redis-server arguments
	// logFile and ownGroup are Options.LogFile and OwnProcessGroup.
	logFile  string
	ownGroup bool

	mu     sync.Mutex
	paused bool
	cmd    *exec.Cmd
	exited <-chan struct{}
	out    *readyWriter
}

// Start starts a redis-server for tb and stops it (by its own PID) in
// tb's cleanup. It skips tb when redis-server is missing, unless CI=true.
// args are passed on to redis-server after the defaults (for example
// "--maxmemory-policy", "allkeys-lru"), for every start of it.
func Start(tb testing.TB, args ...string) *Server {
	tb.Helper()
	s, err := Spawn(tb.TempDir(), 0, args...)
	testproc.Require(tb, err, ErrNoRedis)
	tb.Cleanup(s.Stop)
	return s
}

// Spawn starts a redis-server outside any test (for TestMain); port 0 picks
// a free one, dir "" a new temporary folder; args as for Start. Stop it
// with Stop.
func Spawn(dir string, port int, args ...string) (*Server, error) {
	return SpawnWith(dir, Options{Port: port, Args: args})
}

// Options are the settings of a server started with SpawnWith. The zero
// value is Spawn(dir, 0)'s: a free port, no persistence, the output kept in
// memory only, in the caller's process group.
type Options struct {
	// Port is the server's port; 0 (the default) picks a free one.
	Port int
	// Args are passed on to redis-server after the defaults, for every
	// start of it, as Start's args are; none by default.
	Args []string
	// LogFile, when set, receives the server's output too, appended (a
	// restart adds to it); "" (the default) keeps only the first 64 KiB of
	// it in memory, for error messages.
	LogFile string
	// OwnProcessGroup starts the server in a process group of its own, so
	// that a Ctrl-C in the terminal reaches only the caller, which stops
	// the server (by its PID) when it chooses; false (the default) leaves
	// it in the caller's group, where a Ctrl-C ends it with the caller.
	OwnProcessGroup bool
}

// SpawnWith starts a redis-server outside any test, as Spawn does, with
// the settings of o; dir "" is a new temporary folder. Stop it with Stop.
func SpawnWith(dir string, o Options) (*Server, error) {
	if _, err := os.Stat(Bin); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoRedis, err)
	}
	if dir == "" {
		d, err := os.MkdirTemp("", "testredis-")
		if err != nil {
			return nil, err
		}
		dir = d
	}
	port := o.Port
	s := &Server{dir: dir, port: port, args: o.Args, logFile: o.LogFile, ownGroup: o.OwnProcessGroup}
	var err error
	// A free port can be taken between our probe and redis' bind: try again.
	for range 5 {
		if port == 0 {
			s.port = testproc.FreePort()
		}
		if err = s.start(); err == nil {
			s.Addr = "127.0.0.1:" + strconv.Itoa(s.port)
			return s, nil
		}
	}
	return nil, err
}

// start runs the server and returns once it answers PING.
func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("redis-server already running")
	}
	cmd := exec.Command(Bin, append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", s.dir}, s.args...)...)
	out, exited, err := startReady(cmd, "Ready to accept connections", s.logFile, s.ownGroup, fmt.Sprintf("redis-server on port %d", s.port))
	if err != nil {
		return err
	}
	s.cmd, s.exited, s.out = cmd, exited, out
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(s.port)})
	defer c.Close()
	for range 50 { // bounded: the log line says it listens already
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err = c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
	}
	_ = cmd.Process.Kill()
	<-exited
	s.cmd = nil
	return fmt.Errorf("redis-server on port %d does not answer PING: %w", s.port, err)
}

// Stop kills the server (SIGKILL: a crash, not a shutdown) and waits for it.
// It is idempotent.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	if s.paused {
		// SIGKILL ends a stopped process too; continue it anyway, so that
		// nothing of it stays stopped if the kill fails.
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
		s.paused = false
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Pause stops the server with SIGSTOP (by its own PID): a hung server.
// The kernel still accepts connections and buffers what clients send, but
// nothing is answered until Resume. Stop, and the cleanup of Start, resume
// a paused server before killing it.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP, true) }

// Resume continues a paused server (SIGCONT). It is idempotent.
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT, false) }

func (s *Server) signal(sig syscall.Signal, paused bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return errors.New("redis-server not running")
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("redis-server on port %d: %v: %w", s.port, sig, err)
	}
	s.paused = paused
	return nil
}

// Restart starts a stopped server again on the same port: with no data,
// unless it keeps an append-only file (StartDurable).
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	var err error
	for range 5 { // the port may linger briefly after the kill
		if err = s.start(); err == nil {
			return
		}
	}
	tb.Fatal(err)
}

// StartDurable starts a redis-server as Start does, with an append-only
// file fsynced before every answer (appendonly yes, appendfsync always):
// Restart brings its data back, Wipe does not.
func StartDurable(tb testing.TB, args ...string) *Server {
	tb.Helper()
	return Start(tb, append([]string{"--appendonly", "yes", "--appendfsync", "always"}, args...)...)
}

// Wipe kills the server, deletes its data files and starts it again on the
// same port: a server that lost its disk, or a failover to an empty replica.
func (s *Server) Wipe(tb testing.TB) {
	tb.Helper()
	s.Stop()
	s.removeData(tb)
	s.Restart(tb)
}

// Snapshot stops the server, copies its data files (what a backup, or a
// replica that will lag, holds), starts it again on the same port and
// returns the copy's folder, removed at tb's cleanup.
func (s *Server) Snapshot(tb testing.TB) string {
	tb.Helper()
	backup := tb.TempDir()
	s.Stop()
	copyFiles(tb, s.dir, backup)
	s.Restart(tb)
	return backup
}

// Restore stops the server, replaces its data files with backup's (a
// Snapshot) and starts it again: a restored backup, or a failover to a
// replica that lagged.
func (s *Server) Restore(tb testing.TB, backup string) {
	tb.Helper()
	s.Stop()
	s.removeData(tb)
	copyFiles(tb, backup, s.dir)
	s.Restart(tb)
}

// removeData deletes the stopped server's data files.
func (s *Server) removeData(tb testing.TB) {
	tb.Helper()
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		tb.Fatal(err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(s.dir, e.Name())); err != nil {
			tb.Fatal(err)
		}
	}
}

// copyFiles copies the files of folder from into folder to.
func copyFiles(tb testing.TB, from, to string) {
	tb.Helper()
	if out, err := exec.Command("cp", "-a", from+"/.", to).CombinedOutput(); err != nil {
		tb.Fatalf("cp %s %s: %v: %s", from, to, err, strings.TrimSpace(string(out)))
	}
}

// Client returns a client closed at tb's cleanup. One dial attempt instead
// of go-redis' five keeps the log of tests that stop servers readable; the
// lock must cope with either. Context deadlines are honoured, as the
// service's clients do (locking.WithNodeTimeout).
func (s *Server) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, DialerRetries: 1, ContextTimeoutEnabled: true})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// startReady starts cmd and waits for its own "ready" log line, marker,
// not for a fixed time: at most 10 s, then it kills it. what names it in
// errors.
func startReady(cmd *exec.Cmd, marker, logFile string, ownGroup bool, what string) (*readyWriter, <-chan struct{}, error) {
	out := &readyWriter{ready: make(chan struct{}), marker: marker}
	exited, err := testproc.Start(cmd, out, logFile, ownGroup)
	if err != nil {
		return nil, nil, err
	}
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	select {
	case <-out.ready:
		return out, exited, nil
	case <-exited:
		return nil, nil, fmt.Errorf("%s exited: %s", what, out.String())
	case <-timeout.C:
		_ = cmd.Process.Kill()
		<-exited
		return nil, nil, fmt.Errorf("%s not ready in 10s: %s", what, out.String())
	}
}

// readyWriter keeps a server's output and closes ready once the output
// holds marker (the server's own "ready" line).
type readyWriter struct {
	marker string
	mu     sync.Mutex
	buf    bytes.Buffer
	ready  chan struct{}
	seen   bool
}

func (w *readyWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.buf.Len() < 1<<16 {
		w.buf.Write(p)
	}
	if !w.seen && strings.Contains(w.buf.String(), w.marker) {
		w.seen = true
		close(w.ready)
	}
	return len(p), nil
}

func (w *readyWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// PID is the server's process id, 0 when it is not running: for readings
// of its CPU time in /proc.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}
