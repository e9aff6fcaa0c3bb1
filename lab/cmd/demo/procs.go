package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// process is one child the demo started. Its Wait runs in a goroutine owned
// by the process, which reports the exit on exited; stop signals the child
// by its PID and joins that goroutine.
type process struct {
	name   string
	cmd    *exec.Cmd
	log    *os.File
	exited chan struct{}
	err    error // valid once exited is closed
}

// startProcess starts bin with args and exactly the environment env, its
// output going to logPath.
func startProcess(name, bin string, args, env []string, logPath string) (*process, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group, so a Ctrl-C in the terminal reaches the
	// demo first and the demo stops its children in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, log: log, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// running reports whether the process has not exited.
func (p *process) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM, waits up to grace for the exit, then kills. It is
// safe to call on a process that has exited.
func (p *process) stop(grace time.Duration) error {
	defer p.log.Close()
	if !p.running() {
		return p.exitErr()
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return nil
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("%s did not stop within %s of SIGTERM and was killed", p.name, grace)
	}
}

func (p *process) exitErr() error {
	if p.err == nil {
		return fmt.Errorf("%s exited", p.name)
	}
	return fmt.Errorf("%s exited: %w", p.name, p.err)
}

// tail returns the last lines of the process's log, for error messages.
func (p *process) tail(n int) string {
	f, err := os.Open(p.log.Name())
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// freePort returns a port on 127.0.0.1 that nothing listens on, chosen
// below the kernel's range of ephemeral ports: a port from that range (the
// kernel's own answer to a listen on :0) may become the local port of any
// outgoing connection — the load generator opens thousands — between this
// check and the child's bind (a full demo lost a control's round to
// "bind: address already in use" so). Below the range only another
// listener can take it; the child then fails to start, which the caller
// reports.
func freePort() (int, error) {
	low := ephemeralLow()
	for range 200 {
		if low <= minPickedPort {
			break
		}
		port := minPickedPort + rand.IntN(low-minPickedPort)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // taken
		}
		l.Close()
		return port, nil
	}
	// The range starts too low to leave room below it: the kernel's pick.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// minPickedPort is the lowest port freePort picks: above the well-known
// and most registered services' ports.
const minPickedPort = 20000

// ephemeralLow is the first port of the kernel's ephemeral range (Linux's
// ip_local_port_range; 32768, its default, when it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	low, err := strconv.Atoi(strings.Fields(string(b) + " x")[0])
	if err != nil {
		return 32768
	}
	return low
}

// instance is one service process.
type instance struct {
	*process
	url string
}

// fleet is the instances of one strategy on one backend.
type fleet struct {
	instances []*instance
	env       []string // what every instance got, for the report
}

// serviceEnv are the variables the demo sets for the service; any value the
// demo's own environment has for them is overridden or removed, so that
// e.g. NAIVE_RACE_WINDOW never reaches a strategy that refuses it.
var serviceEnv = []string{"STRATEGY", "DATABASE_URL", "HTTP_ADDR", "ADMIN_TOKEN", "DB_MAX_CONNS",
	"NAIVE_RACE_WINDOW", "REDIS_ADDRS", "REDIS_MODE", "ETCD_ENDPOINTS", "ZK_SERVERS", "LOCK_TTL", "ORDER_TIMEOUT", "LOG_LEVEL", "MIGRATE",
	"HOLD_TTL", "HOLD_SWEEP_EVERY", "PER_USER_LIMIT"}

// childEnv is the demo's environment without the variables in drop, plus
// add.
func childEnv(add, drop []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(drop, name) {
			env = append(env, kv)
		}
	}
	return append(env, add...)
}

// startFleet starts n instances with env and waits until each answers
// /readyz; on any failure the ones started are stopped again.
func startFleet(ctx context.Context, bin string, n int, env []string, logDir string) (*fleet, error) {
	return startFleetWith(ctx, bin, n, env, nil, logDir)
}

// startFleetWith is startFleet with each(i) added to instance i's
// environment, after env (so that it wins), when each is not nil.
func startFleetWith(ctx context.Context, bin string, n int, env []string, each func(i int) []string, logDir string) (*fleet, error) {
	f := &fleet{env: env}
	for i := range n {
		port, err := freePort()
		if err != nil {
			f.stop()
			return nil, err
		}
		name := fmt.Sprintf("i%d", i+1)
		own := append([]string{}, env...)
		if each != nil {
			own = append(own, each(i)...)
		}
		penv := childEnv(append(own, fmt.Sprintf("HTTP_ADDR=127.0.0.1:%d", port)), serviceEnv)
		p, err := startProcess("instance "+name, bin, nil, penv, filepath.Join(logDir, "instance-"+name+".log"))
		if err != nil {
			f.stop()
			return nil, err
		}
		f.instances = append(f.instances, &instance{process: p, url: fmt.Sprintf("http://127.0.0.1:%d", port)})
	}
	for _, in := range f.instances {
		if err := waitReady(ctx, in, 30*time.Second); err != nil {
			f.stop()
			return nil, err
		}
	}
	return f, nil
}

// waitReady polls /readyz until 200, the process exits, or timeout.
func waitReady(ctx context.Context, in *instance, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, in.url+"/readyz", nil)
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-in.exited:
			return fmt.Errorf("%w before it was ready:\n%s", in.exitErr(), in.tail(5))
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %w\n%s", in.name, timeout, ctx.Err(), in.tail(5))
		case <-tick.C:
		}
	}
}

func (f *fleet) urls() []string {
	var out []string
	for _, in := range f.instances {
		out = append(out, in.url)
	}
	return out
}

// dead returns an error for every instance that exited.
func (f *fleet) dead() error {
	var errs []error
	for _, in := range f.instances {
		if !in.running() {
			errs = append(errs, fmt.Errorf("%w:\n%s", in.exitErr(), in.tail(5)))
		}
	}
	return errors.Join(errs...)
}

// stop stops every instance; they shut down in parallel.
func (f *fleet) stop() error {
	if f == nil {
		return nil
	}
	errs := make(chan error, len(f.instances))
	for _, in := range f.instances {
		go func() {
			if !in.running() {
				// Already reported by dead.
				in.log.Close()
				errs <- nil
				return
			}
			errs <- in.stop(15 * time.Second)
		}()
	}
	var all []error
	for range f.instances {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}
