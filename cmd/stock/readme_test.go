package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testdb"
)

// TestReadmeNamesEveryStrategy: the README's table of strategies has a row
// for every registered strategy, with its class, and the README stays the
// front door: at most 300 lines.
func TestReadmeNamesEveryStrategy(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	if n := strings.Count(readme, "\n"); n > 300 {
		t.Errorf("README.md has %d lines; the front door has at most 300 (the rest belongs in docs/)", n)
	}
	for _, s := range strategies.All() {
		var row string
		for line := range strings.Lines(readme) {
			if strings.HasPrefix(line, "| `"+s.Name+"`") {
				row = line
				break
			}
		}
		switch {
		case row == "":
			t.Errorf("README.md's table has no row for %s", s.Name)
		case s.Safe() && !strings.Contains(row, "| safe |"):
			t.Errorf("README.md's row for %s does not say safe: %s", s.Name, row)
		case !s.Safe() && !strings.Contains(row, "control"):
			t.Errorf("README.md's row for %s does not say it is a control: %s", s.Name, row)
		}
	}
}

// TestReadmeQuotesThePublishedRun: every figure in the README's section
// on the latest run is quoted, line for line, from the published report it
// links to (docs/results/<run>/report.md, written by the demo), not
// retyped.
func TestReadmeQuotesThePublishedRun(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	begin := strings.Index(readme, "## What it costs")
	end := strings.Index(readme, "## Configuration")
	if begin < 0 || end < begin {
		t.Fatal("README.md has no section \"## What it costs\" before \"## Configuration\"")
	}
	section := readme[begin:end]
	const prefix = "](docs/results/"
	i := strings.Index(section, prefix)
	if i < 0 {
		t.Fatal("the section links to no report under docs/results/")
	}
	link, _, _ := strings.Cut(section[i+2:], ")")
	report, err := os.ReadFile("../../" + link)
	if err != nil {
		t.Fatalf("the linked report: %v", err)
	}
	quoted := 0
	for line := range strings.Lines(section) {
		line = strings.TrimSpace(line)
		line = strings.TrimSpace(strings.TrimPrefix(line, ">"))
		if !strings.HasPrefix(line, "- ") && !strings.HasPrefix(line, "**") && !strings.Contains(line, " in ") {
			continue
		}
		if !strings.ContainsAny(line, "0123456789") {
			continue
		}
		quoted++
		if !strings.Contains(string(report), line) {
			t.Errorf("README.md says %q, which %s does not", line, link)
		}
	}
	if quoted < 5 {
		t.Errorf("only %d lines with figures found in the section: is it still the demo's summary?", quoted)
	}
	if newest := newestFullRun(t); !strings.HasPrefix(link, "docs/results/"+newest+"/") {
		t.Errorf("README.md quotes %s; the newest full run published is %s", link, newest)
	}
}

// newestFullRun is the folder under docs/results of the newest published
// run in the default mode on both engines with the most strategies (not a
// quick run, not a rerun of a few; a strategy added since is in none):
// folders are named by the run's start.
func newestFullRun(t *testing.T) string {
	t.Helper()
	entries, err := os.ReadDir("../../docs/results")
	if err != nil {
		t.Fatal(err)
	}
	strategiesRun := regexp.MustCompile(`(\d+) strategies × 2 backends`)
	newest, most := "", 0
	for _, e := range entries {
		head, err := os.ReadFile("../../docs/results/" + e.Name() + "/report.md")
		if err != nil || !e.IsDir() {
			continue
		}
		first := string(head[:min(len(head), 600)])
		m := strategiesRun.FindStringSubmatch(first)
		if m == nil || !strings.Contains(first, "mode default") {
			continue
		}
		n, _ := strconv.Atoi(m[1])
		if n > most || n == most && e.Name() > newest {
			newest, most = e.Name(), n
		}
	}
	if newest == "" {
		t.Fatal("docs/results holds no full run")
	}
	return newest
}

// readmeSession is the README's by-hand session: its shell blocks between
// "## Run one strategy by hand" and the next section, in order, and each
// answer it shows (the comment lines "# … → NNN", in order).
func readmeSession(t *testing.T) (script string, shown []string) {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	begin := strings.Index(readme, "## Run one strategy by hand")
	if begin < 0 {
		t.Fatal(`README.md has no section "## Run one strategy by hand"`)
	}
	section := readme[begin:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	var blocks []string
	for rest := section; ; {
		i := strings.Index(rest, "```sh\n")
		if i < 0 {
			break
		}
		rest = rest[i+len("```sh\n"):]
		j := strings.Index(rest, "```")
		if j < 0 {
			t.Fatal("an unclosed ```sh block in the README's session")
		}
		blocks = append(blocks, rest[:j])
		rest = rest[j+3:]
	}
	script = strings.Join(blocks, "")
	for line := range strings.Lines(script) {
		if c, ok := strings.CutPrefix(strings.TrimSpace(line), "# "); ok && strings.Contains(c, " → ") {
			shown = append(shown, c)
		}
	}
	if len(blocks) < 3 || len(shown) < 8 {
		t.Fatalf("the README's session has %d shell blocks and %d answers shown: is it still the by-hand session?", len(blocks), len(shown))
	}
	return script, shown
}

// TestReadmeSessionRunsAsWritten runs the README's by-hand session as
// written, in one bash, from the top of the repository: the set-up, two
// instances (conditional with holds, etcd-lock on its own port) and every
// call, and checks that each answer it prints has the status and the shape
// the README shows for it ("…" stands for what changes from run to run).
// Only the environment is the test's: the instances' addresses (A, B:
// free ports; the README's defaults are 8080 and 8081), the database, and
// the orders' time under the suite's load.
func TestReadmeSessionRunsAsWritten(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts real processes")
	}
	for _, tool := range []string{"bash", "make", "curl", "openssl"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("CI=true and %s is missing: %v", tool, err)
			}
			t.Skipf("%s is missing: %v", tool, err)
		}
	}
	dbURL := testdb.URL(t, "postgres") // skips (fails under CI) without PostgreSQL
	script, shown := readmeSession(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", "set -eu -o pipefail\n"+script)
	cmd.Dir = "../.."
	// The instances read the environment too: under the suite's load a
	// first lock from a fresh etcd (a lease and a key, each fsynced) can
	// take longer than the default 3 s an order may.
	cmd.Env = append(os.Environ(), "A="+freeAddr(t), "B="+freeAddr(t), "DATABASE_URL="+dbURL,
		"ORDER_TIMEOUT=20s", "LOCK_WAIT=15s")
	// Its own process group: whatever the session left running (it ends
	// with kill, but a failure stops it first) is ended with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if err != nil {
		t.Fatalf("the README's session failed: %v\n%s", err, out.String())
	}
	// The session must run on the test's own database, a new schema: on
	// a database kept from run to run (the README's default, stock), the
	// row of s-2 keeps the fence of the last etcd-lock holder of any
	// earlier run, whatever etcd gave its token (each checkout's
	// bin/servers keeps an etcd of its own under .run/servers), and an
	// etcd behind it has the first order fenced off: busy, 503.
	started := 0
	for line := range strings.Lines(out.String()) {
		if strings.Contains(line, `"msg":"starting"`) {
			started++
			if !strings.Contains(line, `"database_url":"`+redactURL(dbURL)+`"`) {
				t.Errorf("an instance started on another database than the test's %s (does the README set DATABASE_URL over the environment's?):\n%s", redactURL(dbURL), line)
			}
		}
	}
	if started != 2 {
		t.Errorf("%d instances logged their start, the session starts 2:\n%s", started, out.String())
	}
	var printed []string
	for line := range strings.Lines(out.String()) {
		if line = strings.TrimSpace(line); strings.Contains(line, " → ") && strings.HasPrefix(line, "{") {
			printed = append(printed, line)
		}
	}
	if len(printed) != len(shown) {
		t.Fatalf("the session printed %d answers, the README shows %d:\n%s", len(printed), len(shown), out.String())
	}
	for i, want := range shown {
		if !shapeOf(want).MatchString(printed[i]) {
			t.Errorf("answer %d: printed\n\t%s\nthe README shows\n\t%s", i+1, printed[i], want)
		}
	}
}

// shapeOf is the README's shown answer as a pattern: literal, with "…"
// standing for any text.
func shapeOf(shown string) *regexp.Regexp {
	parts := strings.Split(shown, "…")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile("^" + strings.Join(parts, ".*") + "$")
}

// TestReadmeQuotesTheRecommendation: the README's "Which to use" lines are
// docs/choosing.md's summary, line for line (the demo computes it from the
// run's data; lab/cmd/demo's tests keep that file the newest full run's), and
// every situation of it is there.
func TestReadmeQuotesTheRecommendation(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	choosing, err := os.ReadFile("../../docs/choosing.md")
	if err != nil {
		t.Fatal(err)
	}
	_, short, ok := strings.Cut(string(choosing), "## In short")
	short, _, _ = strings.Cut(short, "\n## ")
	if !ok {
		t.Fatal(`docs/choosing.md has no "## In short"`)
	}
	_, section, ok := strings.Cut(string(readme), "**Which to use**")
	section, _, _ = strings.Cut(section, "\n## ")
	if !ok {
		t.Fatal(`README.md has no "**Which to use**"`)
	}
	var want, got []string
	for line := range strings.Lines(short) {
		if strings.HasPrefix(line, "- ") {
			want = append(want, strings.TrimSpace(line))
		}
	}
	for line := range strings.Lines(section) {
		if strings.HasPrefix(line, "- ") {
			got = append(got, strings.TrimSpace(line))
		}
	}
	if len(want) == 0 || strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("README.md's recommendation:\n%s\ndocs/choosing.md's summary:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if newest := newestFullRun(t); !strings.Contains(section, "docs/results/"+newest+"/") {
		t.Errorf("README.md's recommendation links another run than the newest full one, %s", newest)
	}
}
