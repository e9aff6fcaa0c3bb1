// Package testetcd runs real etcd servers (Debian's etcd-server) for tests:
// a single member or a three-member cluster on free 127.0.0.1 ports, each
// with its own data folder, stopped by its own PID. It never touches an
// etcd it did not start.
//
// The members run with a 10 ms heartbeat and a 100 ms election timeout, so
// that a lease can live 1 s (etcd refuses TTLs under 1.5 election timeouts)
// and a killed leader is replaced in a fraction of a second.
//
// Without the etcd binary a test skips, except under CI=true, where it
// fails: CI must never pass because a server was missing.
package testetcd

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

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/flashsale/stock/lab/testproc"
)

// Bin is where Debian's etcd-server package puts the server.
const Bin = "/usr/bin/etcd"

// ErrNoEtcd means the etcd binary is missing.
var ErrNoEtcd = errors.New("etcd not found (apt-get install etcd-server)")

// Cluster is one or more etcd members on loopback.
type Cluster struct {
	Members []*Member
}

// Member is one etcd server process.
type Member struct {
	Name       string
	ClientAddr string // host:port
	peerURL    string
	dir        string
	initial    string // --initial-cluster
	external   bool   // not started here: never killed
	opts       Options

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited <-chan struct{}
	log    *memberLog
}

// Start returns the etcd of ETCD_ENDPOINTS when it is set (a cluster this
// package did not start: it cannot be killed or restarted), else starts a
// single-member cluster for tb and stops it in tb's cleanup.
func Start(tb testing.TB) *Cluster {
	if eps := os.Getenv("ETCD_ENDPOINTS"); eps != "" {
		c := &Cluster{}
		for _, ep := range strings.Split(eps, ",") {
			c.Members = append(c.Members, &Member{Name: ep, ClientAddr: strings.TrimSpace(ep), external: true})
		}
		return c
	}
	return StartCluster(tb, 1)
}

// External reports whether the cluster is ETCD_ENDPOINTS', not ours.
func (c *Cluster) External() bool { return len(c.Members) > 0 && c.Members[0].external }

// StartCluster starts n members forming one cluster for tb.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	if _, err := os.Stat(Bin); err != nil {
		if os.Getenv("CI") != "true" {
			tb.Skip(ErrNoEtcd, "(set CI=true to make this a failure)")
		}
		tb.Fatal(ErrNoEtcd)
	}
	c, err := Spawn(tb.TempDir(), n)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Stop)
	return c
}

// Spawn starts n members forming one cluster outside any test (a fault
// suite's, say), with their data under dir, and returns once every member
// answers. It returns ErrNoEtcd when the binary is missing. Stop it with
// Stop; dir stays the caller's to delete.
func Spawn(dir string, n int) (*Cluster, error) {
	return SpawnWith(dir, n, Options{})
}

// Options are the settings of a cluster started with SpawnWith. The zero
// value is Spawn's: errors only in the members' logs, kept in memory only,
// the members in the caller's process group.
type Options struct {
	// LogFile, when set, receives every member's output too, appended (a
	// restart adds to it; the members of a cluster share it); "" (the
	// default) keeps only the first 64 KiB of each in memory, for error
	// messages.
	LogFile string
	// LogLevel is etcd's --log-level (debug, info, warn, error, panic,
	// fatal); "" (the default) is error.
	LogLevel string
	// OwnProcessGroup starts every member in a process group of its own,
	// so that a Ctrl-C in the terminal reaches only the caller, which stops
	// the members (by their PIDs) when it chooses; false (the default)
	// leaves them in the caller's group, where a Ctrl-C ends them with the
	// caller.
	OwnProcessGroup bool
	// V2 serves etcd's v2 API too (--enable-v2), for a client that needs
	// it (Patroni's etcd DCS, lab/testpatroni); false (the default): v3
	// only, as etcd 3.4 does by default.
	V2 bool
}

// SpawnWith starts n members as Spawn does, with the settings of o.
func SpawnWith(dir string, n int, o Options) (*Cluster, error) {
	if _, err := os.Stat(Bin); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoEtcd, err)
	}
	var err error
	for try := range 3 { // a free port can be taken between the probe and etcd's bind
		var c *Cluster
		// A folder per try: a failed try may leave a member's data.
		if c, err = spawn(filepath.Join(dir, fmt.Sprintf("try%d", try+1)), n, o); err == nil {
			return c, nil
		}
	}
	return nil, err
}

// SpawnAt starts a single member that serves clients on 127.0.0.1:client
// and its peers on 127.0.0.1:peer, with its data in dir (kept: started
// again on the same dir, it comes back with its data), for a server that
// must sit on known ports (lab/cmd/servers). Stop it with Stop.
func SpawnAt(dir string, client, peer int) (*Cluster, error) {
	if _, err := os.Stat(Bin); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoEtcd, err)
	}
	return spawnOn(dir, 1, func(i int) (int, int) { return client, peer }, Options{})
}

func spawn(dir string, n int, o Options) (*Cluster, error) {
	return spawnOn(dir, n, func(int) (int, int) { return testproc.FreePort(), testproc.FreePort() }, o)
}

// spawnOn starts n members; ports gives member i's client and peer ports.
func spawnOn(dir string, n int, ports func(i int) (client, peer int), o Options) (*Cluster, error) {
	c := &Cluster{}
	var initial []string
	for i := range n {
		client, peer := ports(i)
		m := &Member{
			Name:       fmt.Sprintf("m%d", i+1),
			ClientAddr: "127.0.0.1:" + strconv.Itoa(client),
			peerURL:    "http://127.0.0.1:" + strconv.Itoa(peer),
			dir:        filepath.Join(dir, fmt.Sprintf("m%d", i+1)),
			opts:       o,
		}
		initial = append(initial, m.Name+"="+m.peerURL)
		c.Members = append(c.Members, m)
	}
	for _, m := range c.Members {
		m.initial = strings.Join(initial, ",")
		if err := m.start(); err != nil {
			c.Stop()
			return nil, err
		}
	}
	if err := c.waitHealthy(30 * time.Second); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// Endpoints are the members' client addresses.
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.Members))
	for i, m := range c.Members {
		eps[i] = m.ClientAddr
	}
	return eps
}

// Client returns a client of the whole cluster, closed at tb's cleanup.
func (c *Cluster) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: nopLogger()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	return cli
}

func (m *Member) start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		return errors.New("etcd member already running")
	}
	state := "new"
	if _, err := os.Stat(filepath.Join(m.dir, "member")); err == nil {
		state = "existing"
	}
	client := "http://" + m.ClientAddr
	level := m.opts.LogLevel
	if level == "" {
		level = "error"
	}
	cmd := exec.Command(Bin,
		"--name", m.Name, "--data-dir", m.dir,
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", m.peerURL, "--initial-advertise-peer-urls", m.peerURL,
		"--initial-cluster", m.initial, "--initial-cluster-state", state,
		"--heartbeat-interval", "10", "--election-timeout", "100",
		"--logger", "zap", "--log-level", level, "--log-outputs", "stderr")
	if m.opts.V2 {
		cmd.Args = append(cmd.Args, "--enable-v2=true")
	}
	m.log = &memberLog{}
	exited, err := testproc.Start(cmd, m.log, m.opts.LogFile, m.opts.OwnProcessGroup)
	if err != nil {
		return err
	}
	m.cmd, m.exited = cmd, exited
	return nil
}

// memberLog keeps the first 64 KiB of a member's log, for error messages.
type memberLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *memberLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buf.Len() < 1<<16 {
		l.buf.Write(p)
	}
	return len(p), nil
}

func (l *memberLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// waitHealthy waits until every running member answers a linearizable read.
func (c *Cluster) waitHealthy(within time.Duration) error {
	deadline := time.Now().Add(within)
	for _, m := range c.Members {
		if !m.running() {
			continue
		}
		for {
			err := m.ping()
			if err == nil {
				break
			}
			if m.exitedEarly() || time.Now().After(deadline) {
				return fmt.Errorf("etcd member %s on %s does not answer: %v\n%s", m.Name, m.ClientAddr, err, m.logText())
			}
		}
	}
	return nil
}

func (m *Member) ping() error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientAddr}, DialTimeout: time.Second, Logger: nopLogger()})
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = cli.Get(ctx, "health")
	return err
}

func (m *Member) logText() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.log == nil {
		return ""
	}
	return m.log.String()
}

func (m *Member) running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cmd != nil
}

func (m *Member) exitedEarly() bool {
	m.mu.Lock()
	exited := m.exited
	m.mu.Unlock()
	if exited == nil {
		return true
	}
	select {
	case <-exited:
		return true
	default:
		return false
	}
}

// Kill stops the member with SIGKILL, by its own PID, and waits for it.
func (m *Member) Kill() {
	if m.external {
		return
	}
	m.mu.Lock()
	cmd, exited := m.cmd, m.exited
	m.cmd = nil
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// Restart starts a killed member again with its data.
func (m *Member) Restart(tb testing.TB) {
	tb.Helper()
	if err := m.Start(); err != nil {
		tb.Fatal(err)
	}
}

// Start starts a killed member again with its data and returns once it
// answers a linearizable read through itself: it has rejoined the cluster
// (it knows the leader and has caught up to the read's index).
func (m *Member) Start() error {
	if m.external {
		return errors.New("testetcd: an external member (ETCD_ENDPOINTS) cannot be started")
	}
	if err := m.start(); err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := m.ping()
		if err == nil {
			return nil
		}
		if m.exitedEarly() || time.Now().After(deadline) {
			return fmt.Errorf("etcd member %s does not come back: %v\n%s", m.Name, err, m.logText())
		}
	}
}

// Running reports whether the member's process runs (it was started here
// and not killed since).
func (m *Member) Running() bool { return m.running() }

// PID is the member's process id, or 0 when it does not run here.
func (m *Member) PID() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return 0
	}
	return m.cmd.Process.Pid
}

// Restart kills every member and starts them again with their data.
func (c *Cluster) Restart(tb testing.TB) {
	tb.Helper()
	for _, m := range c.Members {
		m.Kill()
	}
	for _, m := range c.Members {
		if err := m.start(); err != nil {
			tb.Fatal(err)
		}
	}
	if err := c.waitHealthy(30 * time.Second); err != nil {
		tb.Fatal(err)
	}
}

// Leader returns the index of the member that leads the cluster.
func (c *Cluster) Leader(tb testing.TB) int {
	tb.Helper()
	i, err := c.LeaderIndex(tb.Context())
	if err != nil {
		tb.Fatal(err)
	}
	return i
}

// LeaderIndex returns the index of the running member that says it leads
// the cluster, or an error when none does (an election is under way, or
// the quorum is lost).
func (c *Cluster) LeaderIndex(ctx context.Context) (int, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 2 * time.Second, Logger: nopLogger()})
	if err != nil {
		return -1, err
	}
	defer cli.Close()
	for i, m := range c.Members {
		if !m.running() {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := cli.Status(sctx, m.ClientAddr)
		cancel()
		if err == nil && st.Header.MemberId == st.Leader {
			return i, nil
		}
	}
	return -1, errors.New("no etcd member leads")
}

// Stop kills every member.
func (c *Cluster) Stop() {
	for _, m := range c.Members {
		m.Kill()
	}
}
