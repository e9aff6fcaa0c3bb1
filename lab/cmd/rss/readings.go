package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// commandCalls sums each command's calls over the Redis servers (INFO
// commandstats): what the instance asked them, plus these INFO calls.
func commandCalls(ctx context.Context, addrs []string) map[string]int64 {
	calls := map[string]int64{}
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr, DialerRetries: 1})
		info, err := c.Info(ctx, "commandstats").Result()
		_ = c.Close()
		if err != nil {
			continue
		}
		for line := range strings.Lines(info) {
			// cmdstat_xreadgroup:calls=12,usec=...
			name, rest, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":calls=")
			if !ok {
				continue
			}
			n, _, _ := strings.Cut(rest, ",")
			v, err := strconv.ParseInt(n, 10, 64)
			if err == nil {
				calls[name] += v
			}
		}
	}
	return calls
}

// callsPerSecond is the commands called between two readings, per
// second, busiest first, without the readings' own INFO.
func callsPerSecond(before, after map[string]int64, window time.Duration) string {
	type rate struct {
		name string
		n    float64
	}
	var rates []rate
	for name, n := range after {
		if d := n - before[name]; d > 0 && name != "info" && name != "hello" && name != "client|setinfo" {
			rates = append(rates, rate{name, float64(d) / window.Seconds()})
		}
	}
	if len(rates) == 0 {
		return ""
	}
	slices.SortFunc(rates, func(a, b rate) int { return cmp.Compare(b.n, a.n) })
	var parts []string
	for _, r := range rates {
		parts = append(parts, fmt.Sprintf("%s %.1f/s", strings.ToUpper(r.name), r.n))
	}
	return strings.Join(parts, ", ")
}

// idleCPU is the CPU time the service and the servers spent over window,
// each as a share of one core.
func idleCPU(ctx context.Context, service int, servers []int, window time.Duration) (svc, srv float64, err error) {
	ticks := func() (s, v int64, err error) {
		if s, err = cpuTicks(service); err != nil {
			return 0, 0, err
		}
		for _, pid := range servers {
			t, err := cpuTicks(pid)
			if err != nil {
				return 0, 0, err
			}
			v += t
		}
		return s, v, nil
	}
	s0, v0, err := ticks()
	if err != nil {
		return 0, 0, err
	}
	began := time.Now()
	pause(ctx, window)
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	s1, v1, err := ticks()
	if err != nil {
		return 0, 0, err
	}
	elapsed := time.Since(began).Seconds() * clockTicks
	return float64(s1-s0) / elapsed, float64(v1-v0) / elapsed, nil
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat:
// 100 on every Linux architecture Go builds for.
const clockTicks = 100

// cpuTicks is the process's user plus system time, all its threads, in
// clock ticks.
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; the fields after its
	// closing parenthesis start at field 3.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return utime + stime, nil
}

// rss reads the process's resident set and its peak, in bytes.
func rss(pid int) (now, peak int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %q: %w", name, value, err)
		}
		if name == "VmRSS" {
			now = kb << 10
		} else {
			peak = kb << 10
		}
	}
	if now == 0 {
		return 0, 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return now, peak, sc.Err()
}

// gauge reads one unlabelled sample of /metrics.
func gauge(ctx context.Context, client *http.Client, base, name string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return int64(f), err
		}
	}
	return 0, fmt.Errorf("no %s in /metrics", name)
}
