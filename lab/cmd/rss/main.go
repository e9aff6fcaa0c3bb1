// Command rss measures what a catalog costs the service's memory: for each
// strategy it starts one instance of the service (a built bin/stock) on
// 127.0.0.1 with a scratch PostgreSQL database and private lock servers of
// its own, reads the instance's resident memory once it is ready (VmRSS in
// /proc/PID/status), puts -skus SKUs on sale (PUT /admin/stock/{sku}) and
// places one order on each (POST /orders), and reads it again. It prints
// one Markdown row per strategy.
//
// With -idle it also measures what the catalog costs when nobody buys:
// after the load and -drain, the CPU time (user + system, utime + stime in
// /proc/PID/stat) the instance and the servers started for it spent over
// the -idle window, as a share of one core. Put more than one unit on
// sale per SKU (-units) so that the catalog stays on sale after its one
// order each.
//
//	go build -o /tmp/stock-rss ./cmd/stock
//	go run ./lab/cmd/rss -bin /tmp/stock-rss -skus 100000
//	go run ./lab/cmd/rss -bin /tmp/stock-rss -skus 10000 -units 20 -idle 60s -strategies redis-reserve,redis-watch
//
// Everything it talks to is on 127.0.0.1; it stops only the processes it
// started, by their PIDs, and drops only the databases it created. The
// count of SKUs and the time per strategy are bounded (-skus at most
// 1,000,000; -timeout).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/flashsale/stock/internal/strategies"
)

// maxSKUs bounds -skus: the run must end.
const maxSKUs = 1_000_000

// adminToken is the instances' ADMIN_TOKEN.
const adminToken = "rss-admin-token-0123456789"

type options struct {
	bin        string
	skus       int
	units      int
	workers    int
	timeout    time.Duration
	settle     time.Duration
	linger     time.Duration
	drain      time.Duration
	idle       time.Duration
	postgres   string
	strategies []string
	env        []string
	keep       bool
}

func main() {
	var o options
	var strategies, env string
	flag.StringVar(&o.bin, "bin", "bin/stock", "the service's binary (go build -o ... ./cmd/stock)")
	flag.IntVar(&o.skus, "skus", 100_000, fmt.Sprintf("SKUs put on sale and ordered once each, per strategy (at most %d)", maxSKUs))
	flag.IntVar(&o.units, "units", 1, "units put on sale per SKU (each SKU is ordered once: more than 1 keeps it on sale)")
	flag.DurationVar(&o.idle, "idle", 0, "if set, the CPU the instance and its servers spend over this window once the load has ended and -drain passed")
	flag.DurationVar(&o.drain, "drain", 20*time.Second, "with -idle: wait this long after the load before the idle window (the orders reach the database)")
	flag.IntVar(&o.workers, "workers", 16, "concurrent HTTP clients")
	flag.DurationVar(&o.timeout, "timeout", 30*time.Minute, "bound on one strategy's load")
	flag.DurationVar(&o.settle, "settle", 2*time.Second, "wait after /readyz before the idle reading")
	flag.DurationVar(&o.linger, "linger", 0, "if set, a third reading this long after the load, once the Go runtime "+
		"has collected (it forces a GC every 2 minutes) and returned memory: what stays")
	flag.StringVar(&o.postgres, "postgres", envOr("TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		"PostgreSQL server (a scratch database is created on it per strategy and dropped after)")
	flag.StringVar(&strategies, "strategies", "", "comma-separated strategies (default: every one `bin strategies` lists, redis-reserve and redis-watch last)")
	flag.StringVar(&env, "env", "", "comma-separated NAME=value pairs for every instance (e.g. AUDIT_EVERY=0)")
	flag.BoolVar(&o.keep, "keep", false, "keep the instances' logs (their folder is printed)")
	flag.Parse()
	if o.skus < 1 || o.skus > maxSKUs || o.workers < 1 || o.workers > 256 || o.units < 1 || o.units > 1_000_000 {
		fmt.Fprintf(os.Stderr, "rss: -skus must be 1..%d, -units 1..1000000 and -workers 1..256\n", maxSKUs)
		os.Exit(2)
	}
	if err := loopback(o.postgres); err != nil {
		fmt.Fprintf(os.Stderr, "rss: -postgres: %v\n", err)
		os.Exit(2)
	}
	if env != "" {
		o.env = strings.Split(env, ",")
	}
	if strategies != "" {
		o.strategies = strings.Split(strategies, ",")
	} else {
		all, err := listStrategies(o.bin)
		if err != nil {
			fmt.Fprintf(os.Stderr, "rss: %v\n", err)
			os.Exit(1)
		}
		o.strategies = reservationLast(all)
	}
	// An interrupt ends the load; each strategy's deferred clean-up still
	// stops what it started and drops its database.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "rss: %v\n", err)
		os.Exit(1)
	}
}

// loopback refuses a server URL whose host is not on this machine: the
// run sends load only to 127.0.0.1.
func loopback(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(u.Hostname()); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%q is not a loopback address (127.0.0.1)", u.Hostname())
	}
	return nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// listStrategies asks the binary for its STRATEGY values.
func listStrategies(bin string) ([]string, error) {
	out, err := exec.Command(bin, "strategies").Output()
	if err != nil {
		return nil, fmt.Errorf("%s strategies: %w", bin, err)
	}
	return strings.Fields(string(out)), nil
}

// reservationLast orders the reservation strategies after the others.
func reservationLast(all []string) []string {
	var rest, last []string
	for _, s := range all {
		if slices.Contains(strategies.ReservedNames, s) {
			last = append(last, s)
		} else {
			rest = append(rest, s)
		}
	}
	return append(rest, last...)
}

func run(ctx context.Context, o options) error {
	dir, err := os.MkdirTemp("", "stock-rss-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Fprintf(os.Stderr, "logs in %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	fmt.Printf("| strategy | SKUs | idle VmRSS | VmRSS after | growth | VmHWM | Go heap in use idle → after | goroutines after | failed requests | load | VmRSS, heap %s later | idle CPU over %s: instance, its servers |\n", o.linger, o.idle)
	fmt.Printf("|---|--:|--:|--:|--:|--:|--:|--:|---|--:|--:|--:|\n")
	var errs []error
	for _, s := range o.strategies {
		if ctx.Err() != nil {
			break
		}
		r := measure(ctx, o, s, filepath.Join(dir, s))
		if r.err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s, r.err))
			fmt.Printf("| `%s` | failed: %v |\n", s, oneLine(r.err))
			continue
		}
		later := "–"
		if r.lingerRSS > 0 {
			later = mb(r.lingerRSS) + ", " + mb(r.lingerHeap)
		}
		idle := "–"
		if r.idleService >= 0 {
			idle = fmt.Sprintf("%.2f%%, %.2f%% of a core", 100*r.idleService, 100*r.idleServers)
			if r.idleCalls != "" {
				idle += " (Redis: " + r.idleCalls + ")"
			}
		}
		fmt.Printf("| `%s` | %d | %s | %s | %s | %s | %s → %s | %d | %s | %s | %s | %s |\n", s, r.skus,
			mb(r.idleRSS), mb(r.afterRSS), mb(r.afterRSS-r.idleRSS), mb(r.peak), mb(r.idleHeap), mb(r.afterHeap),
			r.goroutines, failures(r.failed), r.took.Round(time.Second), later, idle)
	}
	return errors.Join(errs...)
}

func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }

func mb(b int64) string { return fmt.Sprintf("%.1f MB", float64(b)/(1<<20)) }

func failures(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s ×%d", k, v))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}
