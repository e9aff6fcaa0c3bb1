// Package testgalera runs a private MariaDB Galera cluster for tests, from
// Debian's mariadb-server 10.11 and galera-4: nodes on free 127.0.0.1
// ports, each with its own data folder, root without a password over TCP,
// state transfers by rsync. Nodes are killed and restarted by their own
// PIDs; it never touches a MariaDB it did not start.
//
// Without a binary a test skips, except under CI=true, where it fails: CI
// must never pass because a server was missing.
package testgalera

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // the "mysql" driver

	"github.com/flashsale/stock/lab/testproc"
)

// Where Debian's mariadb-server and galera-4 packages put what a node
// needs; mariadbd finds the SST script in the PATH.
const (
	Bin        = "/usr/sbin/mariadbd"
	InstallBin = "/usr/bin/mariadb-install-db"
	Provider   = "/usr/lib/galera/libgalera_smm.so"
	sstScript  = "/usr/bin/wsrep_sst_rsync"
	// Debian's own folders, which --basedir (see writeRsyncWrapper) would
	// otherwise move under the cluster's folder.
	pluginDir  = "/usr/lib/mysql/plugin"
	charsetDir = "/usr/share/mysql/charsets"
	messageDir = "/usr/share/mysql"

	// waitWithin bounds a wait given no deadline: an rsync SST of a
	// test's data takes about 4 s on two cores.
	waitWithin = 60 * time.Second
)

var (
	// ErrNoGalera means a binary of the cluster is missing.
	ErrNoGalera = errors.New("mariadbd, mariadb-install-db, libgalera_smm.so or rsync not found (apt-get install mariadb-server galera-4 rsync)")
	// ErrNotSynced means a node was not Synced in time.
	ErrNotSynced = errors.New("galera node not synced")
	// errExited means a node's process ended while it was awaited.
	errExited = errors.New("mariadbd exited")
)

// Options are the settings of a cluster. The zero value is three nodes,
// their logs in the cluster's folder, in the caller's process group.
type Options struct {
	// Nodes is how many nodes the cluster has; 3 by default, the fewest
	// that keep a quorum when one is killed.
	Nodes int
	// LogDir receives each node's error log, node<i>.err (mariadbd's, its
	// SST scripts' and its own output), appended across restarts; "" (the
	// default) is the cluster's folder.
	LogDir string
	// OwnProcessGroup starts every node in a process group of its own, so
	// that a Ctrl-C in the terminal reaches only the caller, which stops
	// them when it chooses; false (the default): the caller's group.
	OwnProcessGroup bool
}

// Cluster is the nodes of one Galera cluster.
type Cluster struct {
	Nodes []*Node
	// Name is the cluster's wsrep_cluster_name, unique per cluster: a
	// node of another cluster that finds a reused port is refused.
	Name string

	dir     string
	gcomm   string // wsrep_cluster_address
	logDir  string
	ownPgrp bool
}

// Node is one mariadbd of the cluster.
type Node struct {
	Name string // node0, node1, …: wsrep_node_name
	Addr string // 127.0.0.1:port, MySQL protocol

	c       *Cluster
	dataDir string
	pidFile string
	logFile string
	gcomm   int // Galera replication
	ist     int // incremental state transfer
	sst     int // rsync's state snapshot transfer

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited <-chan struct{}
}

// Start starts a cluster for tb, as Spawn does, in tb.TempDir, and stops
// it in tb's cleanup. It skips tb when a binary is missing, unless
// CI=true.
func Start(tb testing.TB, o Options) *Cluster {
	tb.Helper()
	c, err := Spawn(tb.TempDir(), o)
	testproc.Require(tb, err, ErrNoGalera)
	tb.Cleanup(c.Stop)
	return c
}

// Spawn starts a cluster outside any test (a fault lab's), with its data
// under dir (which stays the caller's to delete), and returns once every
// node is Synced in it. It returns ErrNoGalera when a binary is missing.
// Stop it with Stop.
func Spawn(dir string, o Options) (*Cluster, error) {
	rsync, err := lookBinaries()
	if err != nil {
		return nil, err
	}
	if o.Nodes < 1 {
		o.Nodes = 3
	}
	// mariadbd runs in its data folder: a relative path would not name it.
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, err
	}
	for try := 1; ; try++ {
		// A port can be taken between our probe and mariadbd's bind, which
		// then exits: try again, on other ports, in a folder of its own.
		// Other failures would repeat.
		c, err := spawn(filepath.Join(dir, fmt.Sprintf("try%d", try)), rsync, o)
		if err == nil || !errors.Is(err, errExited) || try == 3 {
			return c, err
		}
	}
}

func lookBinaries() (rsync string, err error) {
	for _, f := range []string{Bin, InstallBin, Provider, sstScript} {
		if _, err := os.Stat(f); err != nil {
			return "", fmt.Errorf("%w: %w", ErrNoGalera, err)
		}
	}
	if rsync, err = exec.LookPath("rsync"); err != nil {
		return "", fmt.Errorf("%w: %w", ErrNoGalera, err)
	}
	return rsync, nil
}

func spawn(dir, rsync string, o Options) (*Cluster, error) {
	id := make([]byte, 4)
	_, _ = rand.Read(id)
	c := &Cluster{Name: "testgalera-" + hex.EncodeToString(id), dir: dir, logDir: o.LogDir, ownPgrp: o.OwnProcessGroup}
	if c.logDir == "" {
		c.logDir = dir
	}
	if err := os.MkdirAll(c.logDir, 0o755); err != nil {
		return nil, err
	}
	if err := writeRsyncWrapper(filepath.Join(dir, "bin"), rsync); err != nil {
		return nil, err
	}
	ports, err := freePorts(4 * o.Nodes)
	if err != nil {
		return nil, err
	}
	var peers []string
	for i := range o.Nodes {
		name, p := fmt.Sprintf("node%d", i), ports[4*i:]
		n := &Node{Name: name, Addr: "127.0.0.1:" + strconv.Itoa(p[0]), c: c,
			dataDir: filepath.Join(dir, name, "data"), pidFile: filepath.Join(dir, name, "mysqld.pid"),
			logFile: filepath.Join(c.logDir, name+".err"), gcomm: p[1], ist: p[2], sst: p[3]}
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			return nil, err
		}
		peers = append(peers, "127.0.0.1:"+strconv.Itoa(n.gcomm))
		c.Nodes = append(c.Nodes, n)
	}
	c.gcomm = "gcomm://" + strings.Join(peers, ",")
	ctx, cancel := context.WithTimeout(context.Background(), waitWithin)
	defer cancel()
	if err := c.form(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// form starts the nodes without a state snapshot transfer: node0
// bootstraps a cluster, is stopped cleanly, and its data folder (whose
// grastate.dat names the cluster's UUID and seqno) is copied to every
// other node; node0 bootstraps again from that state and the others join
// by IST, with nothing to send. An rsync SST to a fresh node would cost
// about 2 s more per node here.
func (c *Cluster) form(ctx context.Context) error {
	first := c.Nodes[0]
	if err := first.install(ctx); err != nil {
		return err
	}
	if err := first.bootstrap(ctx); err != nil {
		return err
	}
	if err := first.stop(ctx); err != nil {
		return err
	}
	for _, n := range c.Nodes[1:] {
		if out, err := exec.CommandContext(ctx, "cp", "-a", first.dataDir, n.dataDir).CombinedOutput(); err != nil {
			return fmt.Errorf("copy %s's data for %s: %w: %s", first.Name, n.Name, err, out)
		}
	}
	if err := first.bootstrap(ctx); err != nil {
		return err
	}
	// One joiner at a time: joiners started together first form views of
	// their own, which Galera merges after dropping and re-admitting one;
	// that saved about 1 s here, but made the start's length vary more.
	for i, n := range c.Nodes[1:] {
		if err := n.start(false); err != nil {
			return err
		}
		if err := n.waitSynced(ctx, i+2); err != nil {
			return err
		}
	}
	return c.WaitSynced(ctx, len(c.Nodes))
}

// writeRsyncWrapper writes dir/rsync. rsync's daemon, which receives an
// SST, drops to "nobody" when started by root, and then cannot enter the
// data folder ("Permission denied (13)"): under root the wrapper keeps it
// root. mariadbd puts <basedir>/bin first in its SST script's PATH (ahead
// of anything first in ours), so nodes run with --basedir=<dir's parent>.
func writeRsyncWrapper(dir, rsync string) error {
	script := "#!/bin/sh\nexec " + rsync + ` "$@"` + "\n"
	if os.Geteuid() == 0 {
		script = "#!/bin/sh\ncase \" $* \" in\n" +
			`*" --daemon "*) exec ` + rsync + ` --dparam=uid=root --dparam=gid=root "$@" ;;` + "\n" +
			"esac\nexec " + rsync + ` "$@"` + "\n"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "rsync"), []byte(script), 0o755)
}

// freePorts returns n distinct free ports of 127.0.0.1, all held open
// until every one is chosen so that none is handed out twice.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// innodb are the InnoDB settings of mariadb-install-db and mariadbd
// alike, or the first start resizes the redo log. Small, for many nodes
// on a test machine; a commit is written to the OS at once and synced
// once a second, which a killed process does not lose.
var innodb = []string{"--innodb_buffer_pool_size=64M", "--innodb_log_file_size=8M",
	"--innodb_log_buffer_size=4M", "--innodb_flush_log_at_trx_commit=2"}

// rootUser is --user=root when we are root: mariadbd refuses to run as
// root unless told to, and ignores --user with a warning otherwise.
func rootUser() []string {
	if os.Geteuid() == 0 {
		return []string{"--user=root"}
	}
	return nil
}

// install creates the node's data folder with its system tables: root
// connects over TCP without a password; no test database.
func (n *Node) install(ctx context.Context) error {
	args := append([]string{"--no-defaults", "--datadir=" + n.dataDir,
		"--auth-root-authentication-method=normal", "--skip-test-db"}, rootUser()...)
	out, err := exec.CommandContext(ctx, InstallBin, append(args, innodb...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", InstallBin, n.dataDir, err, tail(out))
	}
	return nil
}

// args are mariadbd's arguments; bootstrap starts a new cluster from the
// node's data instead of joining the others.
func (n *Node) args(bootstrap bool) []string {
	node := "127.0.0.1:" + strconv.Itoa(n.gcomm)
	a := append([]string{"--no-defaults"}, rootUser()...) // --no-defaults must come first
	a = append(a,
		"--basedir="+n.c.dir, // for bin/rsync: see writeRsyncWrapper
		"--plugin-dir="+pluginDir, "--character-sets-dir="+charsetDir, "--lc-messages-dir="+messageDir,
		"--datadir="+n.dataDir, "--pid-file="+n.pidFile, "--log-error="+n.logFile,
		"--port="+strings.TrimPrefix(n.Addr, "127.0.0.1:"), "--bind-address=127.0.0.1",
		// Relative to the data folder, where mariadbd works: a test's
		// temporary folder can exceed a Unix socket path's 107 bytes. The
		// SST copies no file at the folder's top.
		"--socket=mysqld.sock", "--skip-name-resolve", "--performance_schema=OFF",
		"--wsrep_on=ON", "--wsrep_provider="+Provider,
		"--wsrep_cluster_name="+n.c.Name, "--wsrep_cluster_address="+n.c.gcomm,
		"--wsrep_node_name="+n.Name, "--wsrep_node_address="+node, "--wsrep_node_incoming_address="+n.Addr,
		"--wsrep_provider_options="+strings.Join([]string{
			"gmcast.listen_addr=tcp://" + node,
			"ist.recv_addr=127.0.0.1:" + strconv.Itoa(n.ist),
			// The writesets kept for IST: a file of this size (128M by
			// default) made at every start.
			"gcache.size=16M",
			// The others drop a killed node after this long without a
			// word from it (5 s by default); keepalives go every second.
			"evs.suspect_timeout=PT3S",
		}, ";"),
		"--wsrep_sst_method=rsync", "--wsrep_sst_receive_address=127.0.0.1:"+strconv.Itoa(n.sst),
		// What Galera requires: row-based replication of InnoDB tables,
		// and auto-increment values that need no table lock.
		"--binlog_format=ROW", "--default_storage_engine=InnoDB", "--innodb_autoinc_lock_mode=2",
	)
	a = append(a, innodb...)
	if bootstrap {
		a = append(a, "--wsrep-new-cluster")
	}
	return a
}

// start starts mariadbd without waiting for it.
func (n *Node) start(bootstrap bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.alive() {
		return fmt.Errorf("testgalera: %s already runs", n.Name)
	}
	cmd := exec.Command(Bin, n.args(bootstrap)...)
	// mariadbd writes its log itself; its output (a bad option, before
	// the log is open) goes to the same file.
	exited, err := testproc.Start(cmd, io.Discard, n.logFile, n.c.ownPgrp)
	if err != nil {
		return fmt.Errorf("start %s: %w", n.Name, err)
	}
	n.cmd, n.exited = cmd, exited
	return nil
}

// bootstrap starts the node as a new cluster of one and waits for it.
func (n *Node) bootstrap(ctx context.Context) error {
	if err := n.start(true); err != nil {
		return err
	}
	return n.waitSynced(ctx, 1)
}

// stop ends the node with SIGTERM, a clean shutdown (its grastate.dat
// then records the last seqno and that it may bootstrap), and waits for
// it; within ctx, else it is killed.
func (n *Node) stop(ctx context.Context) error {
	cmd, exited := n.detach()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		return nil
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("%s did not shut down: %w\n%s", n.Name, context.Cause(ctx), n.logTail())
	}
}

// Kill ends the node with SIGKILL, by its own PID, and waits for it: a
// crash, its grastate.dat left without a seqno.
func (n *Node) Kill() error {
	cmd, exited := n.detach()
	if cmd == nil {
		return fmt.Errorf("testgalera: %s is not running", n.Name)
	}
	// A process that exited by itself is reaped already: ErrProcessDone.
	if err := cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill %s: %w", n.Name, err)
	}
	<-exited
	return nil
}

// detach forgets the node's process, which its caller ends.
func (n *Node) detach() (*exec.Cmd, <-chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	cmd := n.cmd
	n.cmd = nil
	return cmd, n.exited
}

// Restart starts a killed node again on its ports and data folder, and
// returns once it is Synced in a cluster of every running node (by rsync
// SST: a killed node does not know its last seqno, so IST is not
// offered). When no other node runs it bootstraps a new cluster from its
// own data, which may lack what the others committed later. A ctx
// without a deadline gets one of 60 s.
func (n *Node) Restart(ctx context.Context) error {
	if n.Running() {
		return fmt.Errorf("testgalera: %s already runs", n.Name)
	}
	others := 0
	for _, o := range n.c.Nodes {
		if o != n && o.Running() {
			others++
		}
	}
	if others == 0 {
		// After a crash Galera refuses to bootstrap from a node that may
		// not be the most advanced; the caller chose it.
		grastate := filepath.Join(n.dataDir, "grastate.dat")
		b, err := os.ReadFile(grastate)
		if err != nil {
			return fmt.Errorf("bootstrap %s: %w", n.Name, err)
		}
		b = bytes.Replace(b, []byte("safe_to_bootstrap: 0"), []byte("safe_to_bootstrap: 1"), 1)
		if err := os.WriteFile(grastate, b, 0o660); err != nil {
			return fmt.Errorf("bootstrap %s: %w", n.Name, err)
		}
	}
	if err := n.start(others == 0); err != nil {
		return err
	}
	ctx, cancel := withDefaultDeadline(ctx)
	defer cancel()
	return n.waitSynced(ctx, others+1)
}

// Running reports whether the node's process runs: started here, not
// killed since, and not exited by itself.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.alive()
}

func (n *Node) alive() bool {
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.exited:
		return false
	default:
		return true
	}
}

// PID is the node's process id, 0 when it does not run.
func (n *Node) PID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.alive() {
		return 0
	}
	return n.cmd.Process.Pid
}

// Addrs are the nodes' MySQL addresses.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr
	}
	return addrs
}

// Stop kills every running node (SIGKILL, by its PID) and waits for them.
func (c *Cluster) Stop() {
	for _, n := range c.Nodes {
		_ = n.Kill() // the only error: it was not running
	}
}

// WaitSynced waits until every running node reports a primary cluster of
// size nodes (wsrep_cluster_size), that it is Synced in it
// (wsrep_local_state_comment) and ready for queries (wsrep_ready). A ctx
// without a deadline gets one of 60 s.
func (c *Cluster) WaitSynced(ctx context.Context, size int) error {
	ctx, cancel := withDefaultDeadline(ctx)
	defer cancel()
	for _, n := range c.Nodes {
		if n.Running() {
			if err := n.waitSynced(ctx, size); err != nil {
				return err
			}
		}
	}
	return nil
}

func withDefaultDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, waitWithin)
}

// waitSynced polls the node until it is Synced in a cluster of size
// nodes, it exits, or ctx ends. A node receiving an SST does not answer
// yet: the driver's timeouts bound each attempt.
func (n *Node) waitSynced(ctx context.Context, size int) error {
	n.mu.Lock()
	exited, running := n.exited, n.cmd != nil
	n.mu.Unlock()
	if !running { // one that exited by itself is reported below, with its log
		return fmt.Errorf("testgalera: %s is not running", n.Name)
	}
	db, err := sql.Open("mysql", "root@tcp("+n.Addr+")/?timeout=1s&readTimeout=2s&writeTimeout=2s")
	if err != nil {
		return err
	}
	defer db.Close()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	want := map[string]string{"wsrep_cluster_size": strconv.Itoa(size), "wsrep_local_state_comment": "Synced", "wsrep_ready": "ON"}
	var last string // the last answer, for the error
	for {
		st, err := status(ctx, db)
		switch {
		case err == nil && maps.Equal(st, want):
			return nil
		case err == nil:
			last = fmt.Sprint(st)
		case ctx.Err() == nil: // not the deadline's own error
			last = err.Error()
		}
		select {
		case <-tick.C:
		case <-exited:
			return fmt.Errorf("%s on %s: %w\n%s", n.Name, n.Addr, errExited, n.logTail())
		case <-ctx.Done():
			return fmt.Errorf("%w in a cluster of %d: %s on %s: last %s: %w\n%s",
				ErrNotSynced, size, n.Name, n.Addr, last, context.Cause(ctx), n.logTail())
		}
	}
}

// status reads the node's wsrep status; SHOW STATUS is answered even
// before the node is ready for other queries.
func status(ctx context.Context, db *sql.DB) (map[string]string, error) {
	rows, err := db.QueryContext(ctx, "SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_cluster_size', 'wsrep_local_state_comment', 'wsrep_ready')")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	st := map[string]string{}
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return nil, err
		}
		st[strings.ToLower(name)] = value
	}
	return st, rows.Err()
}

// logTail is the end of the node's error log, for error messages.
func (n *Node) logTail() string {
	b, err := os.ReadFile(n.logFile)
	if err != nil {
		return err.Error()
	}
	return n.logFile + ":\n" + tail(b)
}

// tail is the last 6 KiB of b, from a line's start.
func tail(b []byte) string {
	const max = 6 << 10
	if len(b) > max {
		b = b[len(b)-max:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return strings.TrimSpace(string(b))
}
