// Package testzk runs real ZooKeeper servers for tests: a standalone server
// (Start) or a small ensemble on loopback (StartEnsemble), each member on
// free 127.0.0.1 ports with its own data folder, stopped by its own PID. It
// never touches a ZooKeeper it did not start.
//
// The servers tick every 100ms (SpawnWith can set another tick), so the
// shortest session is 200ms (2 x tickTime) and a test can use sessions of
// about a second.
//
// With ZK_SERVERS set (host:port,...), Start starts nothing and returns a
// Server for the first address; such a Server cannot be restarted (a test
// that restarts its server calls StartOwn).
//
// Without java or zookeeper.jar a test skips, except under CI=true, where it
// fails: CI must never pass because a server was missing.
package testzk

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/stock/lab/testproc"
)

// Where Debian's zookeeper package and JDK put things.
const (
	Java = "/usr/bin/java"
	Jar  = "/usr/share/java/zookeeper.jar"
)

// TickTime is the servers' tick unless Options.TickTime says otherwise;
// sessions last between 2 and 600 ticks (Options.MaxSessionTicks).
const TickTime = 100 * time.Millisecond

// classPath: zookeeper.jar's manifest names the rest of its dependencies.
const classPath = Jar + ":/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar"

// ErrNoZooKeeper means java or zookeeper.jar is missing.
var ErrNoZooKeeper = errors.New("java or zookeeper.jar not found")

// Server is one ZooKeeper process (standalone, or one member of an
// Ensemble) on a fixed loopback client port.
type Server struct {
	// Addr is the client address, host:port.
	Addr string

	port     int
	dir      string // holds zoo.cfg, log4j.properties and data/
	main     string // the Java main class
	config   string // zoo.cfg
	heap     string // the JVM's -Xmx; "" is 64m
	external bool   // from ZK_SERVERS: not ours to stop or restart
	logFile  string // Options.LogFile
	ownGroup bool   // Options.OwnProcessGroup

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited <-chan struct{}
	out    *tail
}

// Start starts a standalone ZooKeeper for tb and stops it (by its own PID)
// in tb's cleanup. With ZK_SERVERS set it returns the first of those
// servers instead. It skips tb when java or ZooKeeper is missing, unless
// CI=true.
func Start(tb testing.TB) *Server {
	tb.Helper()
	if env := os.Getenv("ZK_SERVERS"); env != "" {
		addr, _, _ := strings.Cut(env, ",")
		return &Server{Addr: strings.TrimSpace(addr), external: true}
	}
	return StartOwn(tb)
}

// StartOwn starts a standalone ZooKeeper for tb, as Start does, but
// ignores ZK_SERVERS: for a test that restarts or stops its server.
func StartOwn(tb testing.TB) *Server {
	tb.Helper()
	s, err := Spawn(tb.TempDir(), 0)
	skipOrFail(tb, err)
	tb.Cleanup(s.Stop)
	return s
}

func skipOrFail(tb testing.TB, err error) {
	tb.Helper()
	testproc.Require(tb, err, ErrNoZooKeeper)
}

// Spawn starts a standalone ZooKeeper outside any test (for TestMain); port
// 0 picks a free one, dir "" a new temporary folder. Stop it with Stop.
func Spawn(dir string, port int) (*Server, error) {
	return SpawnSized(dir, port, "")
}

// SpawnSized is Spawn with a JVM heap of maxHeap at most (as java's -Xmx
// takes it, e.g. "1g"; "" is the default 64m, enough for tests but not for
// a catalog: zk-lock leaves a folder and a fence node per SKU, and 100,000
// SKUs outgrow 64 MB).
func SpawnSized(dir string, port int, maxHeap string) (*Server, error) {
	return SpawnWith(dir, Options{Port: port, MaxHeap: maxHeap})
}

// Options are the settings of a standalone server started with SpawnWith.
// The zero value is Spawn(dir, 0)'s: a free port, a 64m heap, TickTime,
// sessions of 2 to 600 ticks, no fsync, the output kept in memory only, in
// the caller's process group.
type Options struct {
	// Port is the client port; 0 (the default) picks a free one.
	Port int
	// MaxHeap is the JVM's -Xmx as java takes it ("1g"); "" (the
	// default) is 64m (see SpawnSized).
	MaxHeap string
	// TickTime is the server's tick; 0 (the default) is TickTime, 100ms.
	TickTime time.Duration
	// MaxSessionTicks is the longest session timeout the server grants,
	// in ticks (the shortest is 2); 0 (the default) is 600. ZooKeeper's own
	// default is 20.
	MaxSessionTicks int
	// ForceSync makes the server fsync its transaction log before it
	// answers a write, as ZooKeeper does by default; false (the default)
	// does not (forceSync=no): faster, and enough where the process
	// crashes but the machine does not.
	ForceSync bool
	// LogFile, when set, receives the server's output too, appended (a
	// restart adds to it); "" (the default) keeps only the last 64 KiB of
	// it in memory, for Log.
	LogFile string
	// OwnProcessGroup starts the server in a process group of its own, so
	// that a Ctrl-C in the terminal reaches only the caller, which stops
	// the server (by its PID) when it chooses; false (the default) leaves
	// it in the caller's group, where a Ctrl-C ends it with the caller.
	OwnProcessGroup bool
}

// SpawnWith starts a standalone ZooKeeper outside any test, as Spawn does,
// with the settings of o: its zoo.cfg and log4j.properties in dir ("" for
// a new temporary folder), its data in dir/data. Stop it with Stop.
func SpawnWith(dir string, o Options) (*Server, error) {
	if err := installed(); err != nil {
		return nil, err
	}
	dir, err := ensureDir(dir)
	if err != nil {
		return nil, err
	}
	port := o.Port
	s := &Server{dir: dir, port: port, heap: o.MaxHeap, logFile: o.LogFile, ownGroup: o.OwnProcessGroup,
		main: "org.apache.zookeeper.server.ZooKeeperServerMain"}
	// A free port can be taken between our probe and the server's bind:
	// try again with another.
	for range 5 {
		if port == 0 {
			s.port = testproc.FreePort()
		}
		s.Addr = "127.0.0.1:" + strconv.Itoa(s.port)
		s.config = config(dir, s.port, o)
		if err = s.start(); err == nil {
			return s, nil
		}
	}
	return nil, err
}

func installed() error {
	for _, f := range []string{Java, Jar} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("%w: %v", ErrNoZooKeeper, err)
		}
	}
	return nil
}

func ensureDir(dir string) (string, error) {
	if dir == "" {
		return os.MkdirTemp("", "testzk-")
	}
	return dir, os.MkdirAll(dir, 0o755)
}

func baseConfig(dir string, port int) string { return config(dir, port, Options{}) }

// config is a server's zoo.cfg; of o it reads TickTime, MaxSessionTicks
// and ForceSync.
func config(dir string, port int, o Options) string {
	tick, maxTicks, force := o.TickTime, o.MaxSessionTicks, "no"
	if tick <= 0 {
		tick = TickTime
	}
	if maxTicks <= 0 {
		maxTicks = 600
	}
	if o.ForceSync {
		force = "yes"
	}
	return fmt.Sprintf(`tickTime=%d
minSessionTimeout=%d
maxSessionTimeout=%d
dataDir=%s
clientPort=%d
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr
forceSync=%s
preAllocSize=1024
`, tick.Milliseconds(), 2*tick.Milliseconds(), int64(maxTicks)*tick.Milliseconds(), filepath.Join(dir, "data"), port, force)
}

const log4j = `log4j.rootLogger=WARN, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p %c{1}: %m%n
`

// start runs the server and returns once it serves clients.
func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.external {
		return errors.New("testzk: an external server (ZK_SERVERS) cannot be started")
	}
	if s.cmd != nil {
		return errors.New("testzk: server already running")
	}
	if err := os.MkdirAll(filepath.Join(s.dir, "data"), 0o755); err != nil {
		return err
	}
	cfg := filepath.Join(s.dir, "zoo.cfg")
	if err := os.WriteFile(cfg, []byte(s.config), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(s.dir, "log4j.properties"), []byte(log4j), 0o644); err != nil {
		return err
	}
	// Without the heap flags the JVM grows to some 600 MB.
	heap := s.heap
	if heap == "" {
		heap = "64m"
	}
	cmd := exec.Command(Java, "-Xms16m", "-Xmx"+heap, "-XX:+UseSerialGC",
		"-Dzookeeper.jmx.log4j.disable=true",
		"-cp", s.dir+":"+classPath, s.main, cfg)
	out := &tail{}
	exited, err := testproc.Start(cmd, out, s.logFile, s.ownGroup)
	if err != nil {
		return err
	}

	if err := s.awaitServing(exited); err != nil {
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("testzk: zookeeper on %s: %w: %s", s.Addr, err, out.String())
	}
	s.cmd, s.exited, s.out = cmd, exited, out
	return nil
}

// awaitServing polls the server (a bounded loop: this is a readiness
// check, not synchronisation between test goroutines) until it says it
// serves clients: "imok" to ruok, and for an ensemble member a mode in srvr.
func (s *Server) awaitServing(exited <-chan struct{}) error {
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if s.serving() {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("not serving after 30s")
		}
		select {
		case <-exited:
			return errors.New("exited")
		case <-tick.C:
		}
	}
}

func (s *Server) serving() bool {
	if r, err := FourLetter(s.Addr, "ruok"); err != nil || r != "imok" {
		return false
	}
	r, err := FourLetter(s.Addr, "srvr")
	return err == nil && strings.Contains(r, "Mode: ")
}

// FourLetter sends a four-letter command (ruok and srvr are allowed) and
// returns the answer.
func FourLetter(addr, cmd string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, cmd); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	return strings.TrimSpace(string(b)), err
}

// Stop kills the server (SIGKILL, by its own PID: a crash, not a
// shutdown) and waits for it. Its data stays for a restart. It is
// idempotent, and does nothing to an external server.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Restart stops the server if it runs and starts it again on the same
// port with the same data: sessions and nodes survive, zxids keep growing
// (in a new epoch).
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	if s.external {
		tb.Fatal("testzk: cannot restart an external server (ZK_SERVERS); start one of your own")
	}
	s.Stop()
	var err error
	for range 5 { // the port may linger briefly after the kill
		if err = s.start(); err == nil {
			return
		}
	}
	tb.Fatal(err)
}

// Running reports whether the process runs.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// Log returns the end of the server's output.
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.out == nil {
		return ""
	}
	return s.out.String()
}

// Ensemble is a ZooKeeper ensemble on loopback: members 0..n-1 (server.1
// to server.n in their configuration).
type Ensemble struct {
	Members []*Server
}

// StartEnsemble starts an ensemble of n members for tb and stops them in
// its cleanup; it returns once every member serves. It skips as Start does.
// ZK_SERVERS is ignored: a test that needs an ensemble needs to kill its
// members.
func StartEnsemble(tb testing.TB, n int) *Ensemble {
	tb.Helper()
	e, err := SpawnEnsemble(tb.TempDir(), n)
	skipOrFail(tb, err)
	tb.Cleanup(e.Stop)
	return e
}

// SpawnEnsemble starts an ensemble of n members in dir ("" for a new
// temporary folder) outside any test. Stop it with Stop.
func SpawnEnsemble(dir string, n int) (*Ensemble, error) {
	if err := installed(); err != nil {
		return nil, err
	}
	dir, err := ensureDir(dir)
	if err != nil {
		return nil, err
	}
	e := &Ensemble{Members: make([]*Server, n)}
	var peers strings.Builder
	for i := range e.Members {
		// Three ports each: client, quorum (peer) and leader election.
		fmt.Fprintf(&peers, "server.%d=127.0.0.1:%d:%d\n", i+1, testproc.FreePort(), testproc.FreePort())
		port := testproc.FreePort()
		e.Members[i] = &Server{
			Addr: "127.0.0.1:" + strconv.Itoa(port),
			port: port,
			dir:  filepath.Join(dir, "member"+strconv.Itoa(i+1)),
			main: "org.apache.zookeeper.server.quorum.QuorumPeerMain",
		}
	}
	for i, s := range e.Members {
		s.config = baseConfig(s.dir, s.port) + "initLimit=100\nsyncLimit=20\n" + peers.String()
		if err := os.MkdirAll(filepath.Join(s.dir, "data"), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(s.dir, "data", "myid"), []byte(strconv.Itoa(i+1)+"\n"), 0o644); err != nil {
			return nil, err
		}
	}
	// A member serves only once a quorum has formed: start them together.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, s := range e.Members {
		wg.Go(func() { errs[i] = s.start() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		e.Stop()
		return nil, err
	}
	return e, nil
}

// Addrs returns the members' client addresses.
func (e *Ensemble) Addrs() []string {
	addrs := make([]string, len(e.Members))
	for i, s := range e.Members {
		addrs[i] = s.Addr
	}
	return addrs
}

// Kill kills member i (SIGKILL).
func (e *Ensemble) Kill(i int) { e.Members[i].Stop() }

// Start starts member i again with its data and returns once it serves
// (which needs a quorum of the ensemble).
func (e *Ensemble) Start(i int) error { return e.Members[i].start() }

// Leader returns the index of the member that leads, or -1.
func (e *Ensemble) Leader() int {
	for i, s := range e.Members {
		if r, err := FourLetter(s.Addr, "srvr"); err == nil && strings.Contains(r, "Mode: leader") {
			return i
		}
	}
	return -1
}

// Stop kills every member.
func (e *Ensemble) Stop() {
	for _, s := range e.Members {
		s.Stop()
	}
}

// tail keeps the last 64 KiB of a process's output.
type tail struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(p)
	if over := t.buf.Len() - 64<<10; over > 0 {
		t.buf.Next(over)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.buf.String()
}

// PID is the server's process id, 0 when it is not running or was not
// started here: for readings of its CPU time in /proc.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}
