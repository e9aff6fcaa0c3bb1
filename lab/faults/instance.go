package faults

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Instance is one process of the service (bin/stock) on a loopback port of
// its own, which it keeps across restarts.
type Instance struct {
	Index int
	URL   string
	p     *proc
	base  []string // environment of every start
}

// Cluster is the service instances of one run, sharing one database and
// configuration.
type Cluster struct {
	Instances []*Instance
	token     string
	admin     *http.Client
}

// startCluster starts n instances of binary with env (plus HTTP_ADDR,
// ADMIN_TOKEN, LOG_LEVEL and extra[i] for instance i) and waits until each
// is ready. Their logs go
// to dir/instance-N.log.
func startCluster(ctx context.Context, binary, dir string, n int, extra map[int][]string, env ...string) (*Cluster, error) {
	// Catalog runs make thousands of admin calls from a few dozen
	// goroutines: keep their connections (the default keeps two per host).
	c := &Cluster{token: randomHex(8), admin: &http.Client{Timeout: 10 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: adminWorkers, IdleConnTimeout: 30 * time.Second}}}
	for i := range n {
		addr, err := freeAddr()
		if err != nil {
			c.Close()
			return nil, err
		}
		in := &Instance{
			Index: i,
			URL:   "http://" + addr,
			base:  append(append([]string{"HTTP_ADDR=" + addr, "ADMIN_TOKEN=" + c.token, "LOG_LEVEL=warn"}, env...), extra[i]...),
		}
		in.p = &proc{
			name:    fmt.Sprintf("instance %d", i),
			path:    binary,
			env:     in.base,
			logPath: filepath.Join(dir, fmt.Sprintf("instance-%d.log", i)),
		}
		c.Instances = append(c.Instances, in)
		if err := in.p.start(); err != nil {
			c.Close()
			return nil, err
		}
	}
	for _, in := range c.Instances {
		if err := in.waitReady(ctx, 30*time.Second); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// Close stops every instance (SIGTERM, then SIGKILL after a grace period).
func (c *Cluster) Close() {
	for _, in := range c.Instances {
		in.p.terminate(5 * time.Second)
	}
	c.admin.CloseIdleConnections()
}

// Kill sends SIGKILL to the instance and waits until it is gone.
func (in *Instance) Kill() error { return in.p.kill() }

// Pause stops the instance with SIGSTOP, watchdogs and all, and waits until
// the kernel reports it stopped.
func (in *Instance) Pause() error {
	if err := in.p.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	return in.waitStopped(5 * time.Second)
}

// Resume continues a paused instance (SIGCONT).
func (in *Instance) Resume() error { return in.p.signal(syscall.SIGCONT) }

// Stopped reports whether the instance's process is stopped.
func (in *Instance) Stopped() bool { return in.p.stopped() }

// Restart starts a killed instance again on its address, with extra
// environment on top of the cluster's, and waits until it is ready.
func (in *Instance) Restart(ctx context.Context, extra ...string) error {
	in.p.env = append(append([]string(nil), in.base...), extra...)
	if err := in.p.start(); err != nil {
		return err
	}
	return in.waitReady(ctx, 30*time.Second)
}

func (in *Instance) waitStopped(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !in.p.stopped() {
		if time.Now().After(deadline) {
			return fmt.Errorf("instance %d did not stop within %v", in.Index, timeout)
		}
		time.Sleep(2 * time.Millisecond) // polling /proc: there is no event to wait on
	}
	return nil
}

// waitReady polls /readyz until it answers 200.
func (in *Instance) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	exited := in.p.exitedC()
	client := &http.Client{Timeout: time.Second}
	t := time.NewTicker(25 * time.Millisecond)
	defer t.Stop()
	for {
		resp, err := client.Get(in.URL + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("instance %d: %w before it was ready:\n%s", in.Index, errExited, in.p.tail(2000))
		case <-ctx.Done():
			return fmt.Errorf("instance %d not ready after %v:\n%s", in.Index, timeout, in.p.tail(2000))
		case <-t.C:
		}
	}
}

// Audit is what GET /admin/audit/{sku} answers, as the fault suite and the
// demo's report (lab/report) read it.
type Audit struct {
	SKU        string `json:"sku"`
	Initial    int64  `json:"initial"`
	Available  int64  `json:"available"`
	Ordered    int64  `json:"ordered"`
	Orders     int64  `json:"orders"`
	Consistent bool   `json:"consistent"`
	// Pending: accepted orders not yet in the database (redis-reserve,
	// redis-watch).
	Pending int64 `json:"pending,omitempty"`
	// Drift says how the database disagrees with where the stock is
	// counted (redis-reserve, redis-watch), "" when it does not.
	Drift string `json:"drift,omitempty"`
	// The lifecycle's figures (HOLD_TTL): the units restocks added, held
	// and paid (held + paid = ordered), the units cancelled and expired
	// orders gave back, and those orders' counts.
	Restocked int64 `json:"restocked,omitempty"`
	Held      int64 `json:"held,omitempty"`
	Paid      int64 `json:"paid,omitempty"`
	Returned  int64 `json:"returned,omitempty"`
	Cancelled int64 `json:"cancelled,omitempty"`
	Expired   int64 `json:"expired,omitempty"`
}

// StartSale starts a sale of n units of sku through the first instance that
// answers.
func (c *Cluster) StartSale(ctx context.Context, sku string, n int64) error {
	return c.adminCall(ctx, http.MethodPut, "/admin/stock/"+sku, fmt.Sprintf(`{"available":%d}`, n), nil)
}

// Audit reads the audit of sku through the first instance that answers.
func (c *Cluster) Audit(ctx context.Context, sku string) (Audit, error) {
	var a Audit
	err := c.adminCall(ctx, http.MethodGet, "/admin/audit/"+sku, "", &a)
	return a, err
}

// StartSaleVia starts a sale as StartSale does, through instance first
// if it answers (callers spread a catalog's set-up over the instances).
func (c *Cluster) StartSaleVia(ctx context.Context, first int, sku string, n int64) error {
	return c.adminCallFrom(ctx, first, http.MethodPut, "/admin/stock/"+sku, fmt.Sprintf(`{"available":%d}`, n), nil)
}

// AuditVia reads the audit of sku as Audit does, through instance first if
// it answers.
func (c *Cluster) AuditVia(ctx context.Context, first int, sku string) (Audit, error) {
	var a Audit
	err := c.adminCallFrom(ctx, first, http.MethodGet, "/admin/audit/"+sku, "", &a)
	return a, err
}

func (c *Cluster) adminCall(ctx context.Context, method, path, body string, into any) error {
	return c.adminCallFrom(ctx, 0, method, path, body, into)
}

// adminCallFrom makes an admin call through the running instances in turn,
// from instance first on, until one answers.
func (c *Cluster) adminCallFrom(ctx context.Context, first int, method, path, body string, into any) error {
	var errs []error
	for k := range c.Instances {
		in := c.Instances[(first+k)%len(c.Instances)]
		if in.p.pid() == 0 || in.p.stopped() {
			continue
		}
		err := c.adminOnce(ctx, in, method, path, body, into)
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return fmt.Errorf("%s %s: no instance is running", method, path)
	}
	return errors.Join(errs...)
}

func (c *Cluster) adminOnce(ctx context.Context, in *Instance, method, path, body string, into any) error {
	req, err := http.NewRequestWithContext(ctx, method, in.URL+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.admin.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s on instance %d: %d %s", method, path, in.Index, resp.StatusCode, raw)
	}
	if into != nil {
		return json.Unmarshal(raw, into)
	}
	return nil
}

// Counter sums the samples of a Prometheus counter in the instance's
// /metrics (all label sets). It returns 0 when the metric is absent.
func (in *Instance) Counter(ctx context.Context, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, in.URL+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		if v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); err == nil {
			sum += v
		}
	}
	return sum, sc.Err()
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
