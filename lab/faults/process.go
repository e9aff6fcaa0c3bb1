package faults

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is a child process this package started. Every signal goes to its
// PID or, for a server that forks workers (PostgreSQL), to the process
// group it leads; never to a process found by name.
type proc struct {
	name    string
	path    string
	args    []string
	env     []string // added to os.Environ()
	cred    *syscall.Credential
	group   bool   // started as the leader of its own process group
	logPath string // stdout and stderr are appended here

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // cmd.Wait's, once exited is closed
}

// start runs the process; its output is appended to logPath.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s is already running (pid %d)", p.name, p.cmd.Process.Pid)
	}
	log, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.path, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: p.group, Credential: p.cred}
	err = cmd.Start()
	_ = log.Close() // the child has its own descriptor
	if err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(exited)
	}()
	p.cmd, p.exited = cmd, exited
	return nil
}

// pid returns the running process's PID, or 0.
func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// exitedC returns a channel closed when the process exits (nil if it is not
// running).
func (p *proc) exitedC() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// signal sends sig to the process (or its group).
func (p *proc) signal(sig syscall.Signal) error {
	pid := p.pid()
	if pid == 0 {
		return fmt.Errorf("%s is not running", p.name)
	}
	if p.group {
		return syscall.Kill(-pid, sig)
	}
	return syscall.Kill(pid, sig)
}

// kill sends SIGKILL (a crash, not a shutdown) and waits until the process,
// and with group every process of its group, is gone.
func (p *proc) kill() error {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	pid := cmd.Process.Pid
	if p.group {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	} else {
		_ = cmd.Process.Kill()
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.name, pid)
	}
	if p.group {
		// The workers are not our children: wait until none is left, so
		// that a restart finds the port and the shared memory free.
		deadline := time.Now().Add(10 * time.Second)
		for syscall.Kill(-pid, 0) == nil {
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: processes of group %d survive SIGKILL", p.name, pid)
			}
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			time.Sleep(10 * time.Millisecond) // nothing to wait on for non-children
		}
	}
	p.mu.Lock()
	p.cmd, p.exited = nil, nil
	p.mu.Unlock()
	return nil
}

// terminate asks the process to stop (SIGTERM, after SIGCONT in case it was
// paused) and kills it if it has not exited within grace.
func (p *proc) terminate(grace time.Duration) {
	exited := p.exitedC()
	if exited == nil {
		return
	}
	_ = p.signal(syscall.SIGCONT)
	_ = p.signal(syscall.SIGTERM)
	select {
	case <-exited:
		p.mu.Lock()
		p.cmd, p.exited = nil, nil
		p.mu.Unlock()
		if p.group {
			_ = p.kill() // stragglers of the group, if any
		}
	case <-time.After(grace):
		_ = p.kill()
	}
}

// stopped reports whether the process is in the stopped state (SIGSTOP).
func (p *proc) stopped() bool {
	pid := p.pid()
	if pid == 0 {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return len(f) > 0 && f[0] == "T"
}

// tail returns the end of the process's log, for error messages.
func (p *proc) tail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return ""
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// errExited is returned by waits that end because the process died.
var errExited = errors.New("process exited")
