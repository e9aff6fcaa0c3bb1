package report

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The report as a person sees it: rendered from a small fixed run
// (testdata/smallrun), opened in headless Chromium (Debian's package, which
// make services installs) at 1,400 × 900 px. Chromium runs the page with
// probe.js added at its end and prints the DOM (--dump-dom); the probe
// writes what it measured into the DOM as JSON. Only file:// URLs are
// opened, and the browser's background networking is off.

//go:embed testdata/probe.js
var probeScript string

// Window is the screen the first screen must fit.
const (
	windowWidth  = 1400
	windowHeight = 900
)

// probe is what probe.js measured.
type probe struct {
	InnerWidth, InnerHeight int
	// First is the first screen's elements (by id) with their box
	// before any section is opened.
	First map[string]box
	// Height is the page's height with every section closed.
	Height float64
	// Column is the page's column; Wide the elements that reach outside
	// it or scroll sideways once every section is open.
	Column [2]float64
	Wide   []string
	// Clipped are chart texts outside their drawing.
	Clipped []string
	Links   []string
	IDs     []string
}

type box struct{ Top, Bottom, Left, Right float64 }

// chromium finds Debian's Chromium: a failure under CI=true, where set-up
// installs it, else a skip.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("CI=true and Chromium is not installed (make services installs Debian's chromium)")
	}
	t.Skip("Chromium is not installed: make services installs it (set CI=true to make this a failure)")
	return ""
}

// openInChromium loads page (a file in its folder) with the probe at 1,400
// × 900 px and returns what the probe measured.
func openInChromium(t *testing.T, bin, page string) probe {
	t.Helper()
	src, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	withProbe := strings.Replace(string(src), "</body>", "<script>"+probeScript+"</script></body>", 1)
	if withProbe == string(src) {
		t.Fatalf("%s has no </body>", page)
	}
	// Beside the page, so that its relative links mean the same.
	probed := filepath.Join(filepath.Dir(page), ".probe-"+filepath.Base(page))
	if err := os.WriteFile(probed, []byte(withProbe), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(probed)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
		"--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+t.TempDir(), fmt.Sprintf("--window-size=%d,%d", windowWidth, windowHeight),
		"--hide-scrollbars", "--dump-dom", (&url.URL{Scheme: "file", Path: probed}).String())
	// Its own process group: on a timeout the browser and the helpers it
	// started are ended together, and nothing else.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, lastLines(stderr.String(), 20))
	}
	m := regexp.MustCompile(`<pre id="probe-result">([^<]*)</pre>`).FindSubmatch(stdout.Bytes())
	if m == nil {
		t.Fatalf("the probe wrote no result (a script error?); chromium said:\n%s", lastLines(stderr.String(), 20))
	}
	var p probe
	if err := json.Unmarshal([]byte(html.UnescapeString(string(m[1]))), &p); err != nil {
		t.Fatalf("probe result: %v", err)
	}
	// The layout depends on the width alone (the page uses no vh): the
	// first screen is the top windowHeight px, however tall the window
	// --dump-dom gives the page (757 px of 900 in Chromium 156).
	if p.InnerWidth != windowWidth {
		t.Fatalf("the window is %d px wide, want %d", p.InnerWidth, windowWidth)
	}
	return p
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// pageProblems lists what a person would find wrong with the page in dir:
// the verdict or the recommendation not on the first screen, anything
// wider than the column, a chart label cut, a link that leads nowhere.
func pageProblems(dir string, p probe, firstScreen ...string) []string {
	var out []string
	for _, id := range firstScreen {
		b, ok := p.First[id]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("#%s is not on the page", id))
		case b.Top < 0 || b.Bottom > windowHeight || b.Right > windowWidth:
			out = append(out, fmt.Sprintf("#%s is not within the first %d × %d px: %+v", id, windowWidth, windowHeight, b))
		}
	}
	for _, w := range p.Wide {
		out = append(out, "wider than the column "+fmt.Sprint(p.Column)+": "+w)
	}
	for _, c := range p.Clipped {
		out = append(out, "chart label cut: "+c)
	}
	for _, href := range p.Links {
		if problem := linkProblem(dir, href, p.IDs); problem != "" {
			out = append(out, problem)
		}
	}
	return out
}

// linkProblem says why a link of the page in dir leads nowhere, "" when it
// resolves: an anchor to an id of the page, a relative file that exists
// (an anchor into another page of the folder, to an id of that page).
func linkProblem(dir, href string, ids []string) string {
	u, err := url.Parse(href)
	switch {
	case err != nil:
		return fmt.Sprintf("link %q: %v", href, err)
	case u.Scheme != "" || u.Host != "":
		return fmt.Sprintf("link %q leaves the folder", href)
	case u.Path == "":
		if !slices.Contains(ids, u.Fragment) {
			return fmt.Sprintf("link %q: no element has that id", href)
		}
		return ""
	}
	target := filepath.Join(dir, filepath.FromSlash(u.Path))
	if _, err := os.Stat(target); err != nil {
		return fmt.Sprintf("link %q: %v", href, errors.Unwrap(err))
	}
	if u.Fragment != "" && strings.HasSuffix(u.Path, ".html") {
		b, _ := os.ReadFile(target)
		if !bytes.Contains(b, []byte(`id="`+u.Fragment+`"`)) {
			return fmt.Sprintf("link %q: %s has no such id", href, u.Path)
		}
	}
	return ""
}

// smallRun renders the fixed run's pages into a folder of their own, with
// one run's dashboard beside them as a run's folder would have it; trim
// takes out of the run what it should not have measured.
func smallRun(t *testing.T, trim func(*Report)) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS("testdata/smallrun")); err != nil {
		t.Fatal(err)
	}
	r, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	trim(r)
	dash := filepath.Join(dir, filepath.FromSlash(r.Runs[0].Dashboard))
	if err := os.MkdirAll(filepath.Dir(dash), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dash, []byte("<!doctype html><title>k6</title>"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WritePages(dir, r); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestReportReadsInABrowser: at 1,400 × 900 px the first screen holds the
// verdict and the recommendation; with every section open nothing is wider
// than the page's column and no chart label is cut; every link resolves.
func TestReportReadsInABrowser(t *testing.T) {
	bin := chromium(t)
	dir := smallRun(t, func(*Report) {})
	p := openInChromium(t, bin, filepath.Join(dir, "index.html"))
	for _, problem := range pageProblems(dir, p, "verdict", "choose") {
		t.Error(problem)
	}
	if len(p.Links) == 0 || !slices.Contains(p.Links, "#burst") {
		t.Errorf("the page has no link to its evidence: %q", p.Links)
	}
	// The run's dashboard that is there is linked; the others, missing,
	// are not.
	r, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(p.Links, r.Runs[0].Dashboard) {
		t.Errorf("the dashboard beside the page is not linked: %q", r.Runs[0].Dashboard)
	}
	if _, err := os.Stat(filepath.Join(dir, r.Runs[1].Dashboard)); !errors.Is(err, fs.ErrNotExist) || slices.Contains(p.Links, r.Runs[1].Dashboard) {
		t.Errorf("a missing dashboard is linked, or there: %q", r.Runs[1].Dashboard)
	}
	t.Logf("page height with its sections closed: %.0f px; %d links", p.Height, len(p.Links))
}

// TestQuickReportReadsInABrowser: the same of a run that measured less (no
// catalog, no lifecycle, no fault suite, as a quick run may): the
// situations it lacks say so, and link no section the page leaves out.
func TestQuickReportReadsInABrowser(t *testing.T) {
	bin := chromium(t)
	dir := smallRun(t, func(r *Report) {
		r.Mode, r.CatalogRuns, r.LifecycleRuns, r.Faults = "quick", nil, nil, nil
	})
	p := openInChromium(t, bin, filepath.Join(dir, "index.html"))
	for _, problem := range pageProblems(dir, p, "verdict", "choose") {
		t.Error(problem)
	}
	page, err := os.ReadFile(filepath.Join(dir, "index.html"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(page, []byte("not measured in this run (no catalog: CATALOG_SKUS=0)")) {
		t.Error("the catalog's situation does not say it was not measured")
	}
}

// TestBrowserCheckFindsWhatIsWrong: the same probe and checks on a page
// that breaks each property report each break, so the test above can fail.
func TestBrowserCheckFindsWhatIsWrong(t *testing.T) {
	bin := chromium(t)
	dir := t.TempDir()
	broken := `<!doctype html><html><head><style>body{margin:0} main{max-width:1400px;margin:0 auto;padding:28px 32px}</style></head><body><main>
<div style="height:1000px">a tall header pushes the verdict down</div>
<div id="verdict">verdict</div>
<table id="choose" style="width:1600px"><tr><td>a table wider than the column</td></tr></table>
<details><summary>a closed section</summary><pre style="width:2000px;overflow-x:auto">a wide block inside it</pre></details>
<svg viewBox="0 0 100 20" width="100" height="20"><text x="60" y="14">19,439 of 19,439 units</text></svg>
<a href="missing.html">a file that is not there</a> <a href="#nowhere">an anchor to no id</a> <a href="https://example.com/">outside</a>
</main></body></html>`
	page := filepath.Join(dir, "index.html")
	if err := os.WriteFile(page, []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	problems := strings.Join(pageProblems(dir, openInChromium(t, bin, page), "verdict", "choose"), "\n")
	for _, want := range []string{
		"#verdict is not within the first", "#choose is not within the first",
		"wider than the column", "PRE", "chart label cut: 19,439 of 19,439 units",
		`link "missing.html"`, `link "#nowhere"`, `link "https://example.com/" leaves the folder`,
	} {
		if !strings.Contains(problems, want) {
			t.Errorf("the check missed %q; it found:\n%s", want, problems)
		}
	}
}

// TestFailedReportReadsInABrowser: a run where a safe strategy oversold
// and another did not complete still answers on its first screen: the
// verdict says what failed (its list one click away), and the
// recommendation sends the reader away from the strategy that oversold.
func TestFailedReportReadsInABrowser(t *testing.T) {
	bin := chromium(t)
	// As a real one (20261128-174319): the instance's log, a few lines.
	long := strings.Repeat("an instance's log line that goes on and on, ", 30)
	dir := smallRun(t, func(r *Report) {
		for _, run := range r.Runs {
			switch {
			case run.Strategy == "conditional" && run.Backend == "postgres" && run.Scenario == Burst:
				run.Audit.Ordered, run.Audit.Available = run.Audit.Initial+3, -3
			case run.Strategy == "redis-lock" && run.Backend == "mysql":
				run.Error = "instances did not start: " + long
			}
		}
	})
	p := openInChromium(t, bin, filepath.Join(dir, "index.html"))
	for _, problem := range pageProblems(dir, p, "verdict", "choose") {
		t.Error(problem)
	}
	page, err := os.ReadFile(filepath.Join(dir, "index.html"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"The demonstration failed: 3 problems", "avoid conditional: failed the audit: oversold 3 units"} {
		if !bytes.Contains(page, []byte(want)) {
			t.Errorf("the page does not say %q", want)
		}
	}
}

// TestReportWithAFailoverSectionReadsInABrowser: the same with the
// failover section of the published run (its wide tables, the
// recommendation's row for a replicated database): the first screen still
// holds the verdict and the recommendation, nothing overflows, every link
// resolves.
func TestReportWithAFailoverSectionReadsInABrowser(t *testing.T) {
	bin := chromium(t)
	published, err := Load("../../docs/results/20261207-075801-failover")
	if err != nil {
		t.Fatal(err)
	}
	if published.Failover == nil || len(published.Failover.Replication) == 0 || len(published.Failover.Faults) == 0 {
		t.Fatal("the published run has no failover section")
	}
	dir := smallRun(t, func(r *Report) { r.Failover = published.Failover })
	p := openInChromium(t, bin, filepath.Join(dir, "index.html"))
	for _, problem := range pageProblems(dir, p, "verdict", "choose") {
		t.Error(problem)
	}
	if !slices.Contains(p.Links, "#failover") {
		t.Errorf("the recommendation does not link the failover section: %q", p.Links)
	}
}
