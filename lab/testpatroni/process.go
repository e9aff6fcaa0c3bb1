package testpatroni

// The member's processes: Patroni, started here, and the PostgreSQL it
// starts detached from itself, both ended by their PIDs.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/flashsale/stock/lab/testproc"
)

// start runs the member's Patroni; it returns at once.
func (m *Member) start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		return fmt.Errorf("testpatroni: %s already running", m.Name)
	}
	cmd := exec.Command(Bin, filepath.Join(m.dir, "patroni.yml"))
	cmd.Dir = m.dir
	// Not the caller's PG* variables (PGHOST, PGPASSFILE, …): they would
	// steer Patroni's own connections.
	cmd.Env = []string{"HOME=" + m.dir, "LC_ALL=C.UTF-8", "PATH=" + os.Getenv("PATH")}
	if m.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: m.cred}
	}
	// PostgreSQL inherits Patroni's output, so the pipe outlives Patroni
	// while PostgreSQL runs: bound the wait for it.
	cmd.WaitDelay = 10 * time.Second
	m.log = &tailLog{}
	exited, err := testproc.Start(cmd, m.log, m.logFile, false)
	if err != nil {
		return fmt.Errorf("testpatroni: start %s: %w", m.Name, err)
	}
	m.cmd, m.exited = cmd, exited
	return nil
}

// Running reports whether the member's Patroni runs: started here, not
// killed since, and not exited on its own.
func (m *Member) Running() bool {
	started, exited := m.state()
	return started && !exited
}

// state: Patroni was started and not killed since; it has exited.
func (m *Member) state() (started, exited bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return false, false
	}
	select {
	case <-m.exited:
		return true, true
	default:
		return true, false
	}
}

// Log is the tail of the member's output: Patroni's and its PostgreSQL's.
func (m *Member) Log() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.log == nil {
		return ""
	}
	return m.log.String()
}

// Kill ends the member as a crash of its machine would: SIGKILL, by PID,
// to its Patroni, its PostgreSQL (the postmaster of postmaster.pid, which
// Patroni starts detached from itself) and all their children, and waits
// until they have exited. It is idempotent.
func (m *Member) Kill() error {
	m.mu.Lock()
	cmd, exited := m.cmd, m.exited
	m.cmd = nil
	m.mu.Unlock()
	if cmd == nil {
		return nil
	}
	var pids []int
	if cmd.Process.Signal(syscall.SIGSTOP) == nil { // else it exited on its own
		pids = stopTree(cmd.Process.Pid)
	}
	pm := m.postmasterPID()
	if pm > 0 && syscall.Kill(pm, syscall.SIGSTOP) == nil {
		pids = append(pids, stopTree(pm)...)
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	<-exited
	m.mu.Lock()
	m.postmaster = pm
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, pid := range pids {
		// A zombie has exited: its parent (init, for the postmaster and
		// its children) reaps it when it chooses.
		if err := waitGone(ctx, pid, true); err != nil {
			return fmt.Errorf("testpatroni: kill %s: %w", m.Name, err)
		}
	}
	return nil
}

// Freeze stops the member as a paused machine (a VM paused, a stalled
// disk) would be: SIGSTOP, by PID, to its Patroni, its PostgreSQL and all
// their children. A frozen leader keeps its key in etcd until the key's
// ttl runs out, then its standby is promoted; Thaw wakes it as a deposed
// primary, which Patroni demotes when it runs again.
func (m *Member) Freeze() error {
	m.mu.Lock()
	cmd := m.cmd
	m.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("testpatroni: freeze %s: not running", m.Name)
	}
	var pids []int
	if cmd.Process.Signal(syscall.SIGSTOP) == nil {
		pids = stopTree(cmd.Process.Pid)
	}
	if pm := m.postmasterPID(); pm > 0 && syscall.Kill(pm, syscall.SIGSTOP) == nil {
		pids = append(pids, stopTree(pm)...)
	}
	paused := make([]frozenProc, 0, len(pids))
	for _, pid := range pids {
		paused = append(paused, frozenProc{pid: pid, start: procStart(pid)})
	}
	m.mu.Lock()
	m.paused = append(m.paused, paused...)
	m.mu.Unlock()
	return nil
}

// Thaw continues what Freeze stopped (a process whose PID was reused
// since is left alone).
func (m *Member) Thaw() {
	m.mu.Lock()
	paused := m.paused
	m.paused = nil
	m.mu.Unlock()
	thaw(paused)
}

// postmasterPID is the PID of postmaster.pid when that process is a
// PostgreSQL of this member's data (not a PID reused since), else 0.
func (m *Member) postmasterPID() int {
	b, err := os.ReadFile(filepath.Join(m.dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return 0
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || !bytes.Contains(cmdline, []byte(m.dataDir)) {
		return 0
	}
	return pid
}

// stopTree is pid, which the caller stopped (SIGSTOP), and its
// descendants, each stopped before its children are read: none can fork
// between the reading and the kill. Children are read per thread, as
// Linux lists them: Patroni runs pg_rewind from a thread.
func stopTree(pid int) []int {
	pids := []int{pid}
	files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		for _, field := range strings.Fields(string(b)) {
			if child, err := strconv.Atoi(field); err == nil && syscall.Kill(child, syscall.SIGSTOP) == nil {
				pids = append(pids, stopTree(child)...)
			}
		}
	}
	return pids
}

// waitGone waits until pid has no process, or only a zombie when zombies
// is set.
func waitGone(ctx context.Context, pid int, zombies bool) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		state := procState(pid)
		if state == 0 || zombies && state == 'Z' {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("process %d still there (state %c): %w", pid, state, context.Cause(ctx))
		}
	}
}

// procState is a process's state from /proc/<pid>/stat, 0 without one.
func procState(pid int) byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	// "pid (comm) state …", where comm may hold spaces and parentheses.
	if i := bytes.LastIndexByte(b, ')'); err == nil && i >= 0 && i+2 < len(b) {
		return b[i+2]
	}
	return 0
}

// Restart starts a killed member's Patroni again, on its ports and data,
// and returns once WaitReady does (within ctx, at most 90 s): the member
// follows the primary again, rewound if it had diverged.
func (m *Member) Restart(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyWithin)
	defer cancel()
	m.mu.Lock()
	pm := m.postmaster
	m.mu.Unlock()
	if pm > 0 {
		// Patroni takes a zombie of the old postmaster (psutil counts it as
		// running) for a live PostgreSQL: wait until init has reaped it.
		if err := waitGone(ctx, pm, false); err != nil {
			return fmt.Errorf("testpatroni: restart %s: the old postmaster is not reaped: %w", m.Name, err)
		}
	}
	if err := m.start(); err != nil {
		return err
	}
	return m.c.WaitReady(ctx)
}

// tailLog keeps the last 64 KiB (up to 128) of a member's output.
type tailLog struct {
	mu  sync.Mutex
	buf []byte
}

func (l *tailLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	if len(l.buf) > 1<<17 {
		l.buf = append([]byte(nil), l.buf[len(l.buf)-1<<16:]...)
	}
	return len(p), nil
}

func (l *tailLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.buf)
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
