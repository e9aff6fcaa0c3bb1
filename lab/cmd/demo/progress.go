package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// progress prints what the demo is doing: which step of how many, how far
// the current k6 run is, and its rates so far. On a terminal the current
// line is redrawn in place; otherwise (make demo | tee, CI) a line is
// printed every few seconds so that logs stay readable.
type progress struct {
	mu      sync.Mutex
	out     io.Writer
	tty     bool
	step    int
	steps   int
	started time.Time
	last    time.Time
	drawn   bool
}

func newProgress(out io.Writer, steps int) *progress {
	tty := false
	if f, ok := out.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	return &progress{out: out, tty: tty, steps: steps, started: time.Now()}
}

// setSteps changes the number of steps, when the plan shrinks before it
// runs (a strategy skipped because its server could not start).
func (p *progress) setSteps(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.steps = n
}

// begin starts the next step.
func (p *progress) begin(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clear()
	p.step++
	fmt.Fprintf(p.out, "[%2d/%d %s] %s\n", p.step, p.steps, clock(time.Since(p.started)), fmt.Sprintf(format, args...))
	p.last = time.Now()
}

// note prints a line within the current step.
func (p *progress) note(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clear()
	fmt.Fprintf(p.out, "        %s\n", fmt.Sprintf(format, args...))
}

// update shows a running k6 job.
func (p *progress) update(label string, elapsed, planned time.Duration, reqs, orders float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	how := fmt.Sprintf("%5.1fs", elapsed.Seconds())
	if planned > 0 {
		how += fmt.Sprintf(" of ~%.0fs", planned.Seconds())
	}
	secs := max(elapsed.Seconds(), 0.001)
	line := fmt.Sprintf("        %s: %s  %7.0f requests (%5.0f/s)", label, how, reqs, reqs/secs)
	if orders > 0 {
		line += fmt.Sprintf("  %6.0f orders (%5.0f/s)", orders, orders/secs)
	}
	if p.tty {
		fmt.Fprintf(p.out, "\r%-110s", line)
		p.drawn = true
		return
	}
	if time.Since(p.last) >= 5*time.Second {
		fmt.Fprintln(p.out, line)
		p.last = time.Now()
	}
}

// finish prints the outcome of a k6 job.
func (p *progress) finish(label string, res k6Result) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clear()
	status := "ok"
	switch {
	case res.Err != nil:
		status = "ERROR: " + firstLine(res.Err.Error())
	case res.ExitCode == 99:
		status = "thresholds crossed (exit 99)"
	case res.ExitCode != 0:
		status = fmt.Sprintf("exit %d", res.ExitCode)
	}
	fmt.Fprintf(p.out, "        %s: k6 done in %.1fs, %s\n", label, res.Wall.Seconds(), status)
}

func (p *progress) clear() {
	if p.tty && p.drawn {
		fmt.Fprintf(p.out, "\r%-110s\r", "")
		p.drawn = false
	}
}

func clock(d time.Duration) string {
	d = d.Round(time.Second)
	return fmt.Sprintf("%d:%02d", int(d.Minutes()), int(d.Seconds())%60)
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
