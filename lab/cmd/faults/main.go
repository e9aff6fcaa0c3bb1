// Command faults runs the fault scenarios of lab/faults against the
// service binary: three instances under load, one fault each (kill -9, a
// paused lock holder, Redis servers lost, the database crashed, clients
// retrying with their Idempotency-Key, the leader of etcd-lock's or
// zk-lock's cluster killed, the Redis reservation's Redis restarted, wiped
// and its database crashed), then the audit, the order rows and a
// linearizability check of every SKU's history. Scenario 9 runs the Redis
// restart and wipe, a database crash and an instance kill with a catalog
// of 10,000 SKUs on sale (-catalog-skus changes it), a few of them hot;
// scenario 10 is the restart table: the time to the first 201 after a
// Redis restart with 200, 2,000 and 10,000 SKUs on sale; scenario 11
// kills the sweeping instance, and the database, mid-sweep while orders
// come back (HOLD_TTL, PER_USER_LIMIT); scenario 12 kills the durable Redis
// of redis-reserve and redis-watch while cancels and expiries are relayed
// to it, and restarts it from its append-only file; scenario 13 checks the
// sold-out mark (SOLD_OUT_TTL) across instances while units come back, one
// instance frozen past its bound, with a control whose marks outlive it;
// scenario 14 kills the Redis primary of redis-reserve and redis-watch
// behind Sentinel while its replicas lag, with a control without WAIT;
// scenario 15 loses the PostgreSQL primary under Patroni (killed, or frozen
// past the leader's ttl), with a control on asynchronous replication;
// scenario 16 kills one node of a Galera cluster and restarts it.
//
// It starts everything it uses — the service instances, Redis servers, etcd
// and ZooKeeper, and a private PostgreSQL and MariaDB in temporary folders —
// and stops them by their PIDs; it never touches the machine's own servers.
//
// It writes reports/faults/<timestamp>/faults.md and faults.json (plus the
// runs' logs, and porcupine's HTML for a history that is not linearizable),
// points reports/faults/latest at it, and exits 1 when a safe configuration
// oversold, lost or invented an order, or a run could not be carried out.
//
// Usage: faults [-bin bin/stock] [-out reports/faults] [-scenarios 1,2,...] [-short] [-catalog-skus n]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/flashsale/stock/lab/faults"
)

func main() {
	code, err := run()
	if err != nil {
		fmt.Fprintf(os.Stderr, "faults: %v\n", err)
		os.Exit(2)
	}
	os.Exit(code)
}

func run() (int, error) {
	bin := flag.String("bin", "bin/stock", "the service binary (built without -race)")
	out := flag.String("out", "reports/faults", "where the report folders go")
	only := flag.String("scenarios", "", "comma-separated scenario numbers to run (default: all fourteen)")
	short := flag.Bool("short", false, "run the short forms (a few seconds of load each)")
	catalogSKUs := flag.Int("catalog-skus", 0, "SKUs on sale in scenario 9's catalog runs (default 10,000; -short 1,000)")
	flag.Parse()

	want, err := scenarioFilter(*only)
	if err != nil {
		return 0, err
	}
	binary, err := filepath.Abs(*bin)
	if err != nil {
		return 0, err
	}
	if _, err := os.Stat(binary); err != nil {
		return 0, fmt.Errorf("%v (run `make build` first)", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	started := time.Now()
	dir := filepath.Join(*out, started.Format("20060102-150405"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	logf := func(format string, args ...any) {
		fmt.Printf("%s %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	env := &faults.Env{Binary: binary, Dir: dir, Short: *short, CatalogSKUs: *catalogSKUs, Logf: logf}

	// One private server per engine for every run; each run gets a fresh
	// database on it, and scenario 5 crashes and restarts it.
	logf("starting a private PostgreSQL and MariaDB")
	if env.Postgres, err = faults.StartPostgres(ctx); err != nil {
		logf("PostgreSQL: %v", err)
	} else {
		defer env.Postgres.Close()
	}
	if env.MariaDB, err = faults.StartMariaDB(ctx); err != nil {
		logf("MariaDB: %v", err)
	} else {
		defer env.MariaDB.Close()
	}
	env.NewDatabase = func(ctx context.Context, engine string) (string, error) {
		server := env.Postgres
		if engine == "mysql" {
			server = env.MariaDB
		}
		if server == nil {
			return "", fmt.Errorf("%w: no private %s server", faults.ErrMissing, engine)
		}
		return server.NewDatabase(ctx, "faults_"+strconv.FormatInt(time.Now().UnixNano(), 36))
	}

	results := env.All(ctx, want)
	rep := faults.Report{Version: 1, Started: started, Finished: time.Now(), Short: *short,
		Verdict: faults.SuiteVerdict(results), Runs: results}
	if ctx.Err() != nil {
		rep.Verdict = faults.VerdictError
	}
	if err := writeReport(dir, rep); err != nil {
		return 0, err
	}
	latest := filepath.Join(*out, "latest")
	_ = os.Remove(latest)
	if err := os.Symlink(filepath.Base(dir), latest); err != nil {
		logf("cannot link %s: %v", latest, err)
	}

	fmt.Println()
	for _, r := range results {
		fmt.Println(r.Line)
	}
	fmt.Printf("\nsuite: %s in %.0fs; report: %s\n", strings.ToUpper(string(rep.Verdict)),
		rep.Finished.Sub(started).Seconds(), filepath.Join(dir, "faults.md"))
	if rep.Verdict != faults.VerdictOK {
		return 1, nil
	}
	return 0, nil
}

func scenarioFilter(list string) (func(int) bool, error) {
	if list == "" {
		return nil, nil
	}
	var want []int
	for _, s := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 16 {
			return nil, fmt.Errorf("-scenarios: %q is not a scenario number from 1 to 16", s)
		}
		want = append(want, n)
	}
	return func(n int) bool { return slices.Contains(want, n) }, nil
}

func writeReport(dir string, rep faults.Report) error {
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "faults.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "faults.md"))
	if err != nil {
		return err
	}
	if err := faults.WriteMarkdown(f, rep); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
