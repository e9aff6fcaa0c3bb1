package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/flashsale/stock/lab/report"
)

// resolveK6 returns the path of the pinned k6 that loadtest/go.mod names,
// building it on first use: `go tool -n k6` prints the cached binary's path,
// so the demo does not pay for `go tool`'s staleness check on every run.
// The first build takes about 4 minutes and 840 MB of memory; later ones are
// served from the build cache.
func resolveK6(ctx context.Context, loadtestDir string) (string, error) {
	if p := os.Getenv("K6"); p != "" {
		return p, nil
	}
	cmd := exec.CommandContext(ctx, "go", "tool", "-n", "k6")
	cmd.Dir = loadtestDir
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return "", fmt.Errorf("building k6 with `go tool -n k6` in %s: %w", loadtestDir, err)
	}
	path := strings.TrimSpace(string(out))
	if path == "" {
		return "", fmt.Errorf("`go tool -n k6` printed no path")
	}
	return path, nil
}

// k6Job is one k6 run.
type k6Job struct {
	// Label names the run in the progress line.
	Label string
	// Script is relative to loadtest/.
	Script string
	// Vars are passed as -e NAME=value, in this order.
	Vars [][2]string
	// Dir receives summary.json, summary.txt, k6.log and, with Dashboard,
	// dashboard.html.
	Dir       string
	Dashboard bool
	// DashboardPeriod is the dashboard's sampling period; k6 exports
	// nothing for a run shorter than about two periods. Default 1s.
	DashboardPeriod string
	// Planned is how long the load should take, for the progress line (0:
	// until done).
	Planned time.Duration
	// Meter, when set, reads the CPU of the run's processes while k6 runs
	// (k6 itself is added to it), for the result's Cost and SellCost.
	Meter *cpuMeter
}

// k6Runner runs k6 jobs one after the other and shows their progress.
type k6Runner struct {
	bin         string
	loadtestDir string
	progress    *progress
}

// k6Result is what a run left behind.
type k6Result struct {
	ExitCode int
	Summary  *report.Summary
	// Command is the command line a person would type, from loadtest/.
	Command string
	Wall    time.Duration
	// Err is set when k6 did not run or left no summary; a non-zero exit
	// alone (99: a threshold crossed) is not an error here.
	Err error
	// Cost and SellCost are what the load cost (runCosts), with a Meter.
	Cost, SellCost *report.CPUCost
}

// k6CannotStartRESTAPI is k6's exit code when its REST API cannot listen
// (go.k6.io/k6/errext/exitcodes.CannotStartRESTAPI).
const k6CannotStartRESTAPI = 106

// start runs k6 with args and env, its output to log, polling its REST API
// on port for the progress line, and returns when k6 has exited.
func (k *k6Runner) start(ctx context.Context, job k6Job, args, env []string, log *os.File, port int) (time.Time, *k6Samples, error) {
	cmd := exec.CommandContext(ctx, k.bin, args...)
	cmd.Dir = k.loadtestDir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = log, log
	// On Ctrl-C k6 gets SIGINT, stops the load, runs teardown and writes
	// its summary; only if that hangs is it killed.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 45 * time.Second

	started := time.Now()
	if err := cmd.Start(); err != nil {
		return started, nil, fmt.Errorf("starting k6: %w", err)
	}
	api := fmt.Sprintf("http://127.0.0.1:%d", port)
	// The poller and the sampler are owned by this call: stopped and
	// joined before return.
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		k.poll(api, job, started, stop)
	}()
	var samples *k6Samples
	sampled := make(chan struct{})
	if job.Meter != nil {
		samples = newK6Samples(job.Meter, cmd.Process.Pid, job.Script)
		go func() {
			defer close(sampled)
			samples.run(api, stop)
		}()
	} else {
		close(sampled)
	}
	err := cmd.Wait()
	close(stop)
	<-done
	<-sampled
	if samples != nil && cmd.ProcessState != nil {
		samples.exited(cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime())
	}
	return started, samples, err
}

// run runs job, polling k6's REST API for the progress line while it runs.
func (k *k6Runner) run(ctx context.Context, job k6Job) k6Result {
	var res k6Result
	if err := os.MkdirAll(job.Dir, 0o755); err != nil {
		res.Err = err
		return res
	}
	summaryPath := filepath.Join(job.Dir, "summary.json")
	vars := append(append([][2]string{}, job.Vars...),
		[2]string{"SUMMARY_JSON", summaryPath},
		[2]string{"SUMMARY_TXT", filepath.Join(job.Dir, "summary.txt")})
	args := []string{"run", "--quiet", "--address", "127.0.0.1:0"}
	for _, v := range vars {
		args = append(args, "-e", v[0]+"="+v[1])
	}
	args = append(args, job.Script)
	var env []string
	if job.Dashboard {
		period := job.DashboardPeriod
		if period == "" {
			period = "1s"
		}
		env = []string{
			"K6_WEB_DASHBOARD=true",
			// No server: the demo only wants the export. A run shorter
			// than the dashboard's period (10s by default) would export
			// nothing, hence the short period.
			"K6_WEB_DASHBOARD_PORT=-1",
			"K6_WEB_DASHBOARD_PERIOD=" + period,
			"K6_WEB_DASHBOARD_EXPORT=" + filepath.Join(job.Dir, "dashboard.html"),
		}
	}
	words := []string{"cd loadtest &&"}
	if len(env) > 0 {
		words = append(words, shellJoin(env))
	}

	// k6's REST API (the progress poll) listens on a port picked free a
	// moment before; another process can take it in between (an outgoing
	// connection's ephemeral port, with thousands of them in a burst).
	// k6 then exits at once with CannotStartRESTAPI, before its setup, so
	// the run is tried again on another port.
	var started time.Time
	var waitErr error
	var log *os.File
	var samples *k6Samples
	for try := 1; ; try++ {
		port, err := freePort()
		if err != nil {
			res.Err = err
			return res
		}
		args[3] = fmt.Sprintf("127.0.0.1:%d", port)
		res.Command = strings.Join(append(words, "go tool k6", shellJoin(args)), " ")
		if log, err = os.Create(filepath.Join(job.Dir, "k6.log")); err != nil {
			res.Err = err
			return res
		}
		started, samples, waitErr = k.start(ctx, job, args, env, log, port)
		var ee *exec.ExitError
		if try < 3 && errors.As(waitErr, &ee) && ee.ExitCode() == k6CannotStartRESTAPI {
			log.Close()
			continue
		}
		break
	}
	defer log.Close()
	res.Wall = time.Since(started)

	var ee *exec.ExitError
	switch {
	case waitErr == nil:
	case errors.As(waitErr, &ee) && ee.ExitCode() > 0:
		res.ExitCode = ee.ExitCode()
	default:
		res.Err = fmt.Errorf("k6: %w", waitErr)
		res.ExitCode = -1
	}
	s, err := report.ReadSummary(summaryPath)
	if err != nil {
		res.Err = errors.Join(res.Err, fmt.Errorf("k6 left no summary (exit %d, see %s): %w", res.ExitCode, log.Name(), err))
	}
	res.Summary = s
	if samples != nil && s != nil {
		res.Cost, res.SellCost = samples.costs(s)
	}
	k.progress.finish(job.Label, res)
	return res
}

// poll shows the run's progress until stop closes.
func (k *k6Runner) poll(api string, job k6Job, started time.Time, stop <-chan struct{}) {
	client := &http.Client{Timeout: 500 * time.Millisecond}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		reqs, _ := k6Counter(client, api, "http_reqs")
		orders, _ := k6Counter(client, api, "orders")
		k.progress.update(job.Label, time.Since(started), job.Planned, reqs, orders)
	}
}

// k6Counters reads every counter from k6's REST API (GET /v1/metrics):
// one request, however many counters the caller needs.
func k6Counters(client *http.Client, api string) (map[string]float64, error) {
	resp, err := client.Get(api + "/v1/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil, fmt.Errorf("k6 API: %s", resp.Status)
	}
	var body struct {
		Data []struct {
			ID         string `json:"id"`
			Attributes struct {
				Type   string             `json:"type"`
				Sample map[string]float64 `json:"sample"`
			} `json:"attributes"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, m := range body.Data {
		if m.Attributes.Type == "counter" {
			out[m.ID] = m.Attributes.Sample["count"]
		}
	}
	return out, nil
}

// k6Counter reads a counter from k6's REST API (GET /v1/metrics/{name}).
func k6Counter(client *http.Client, api, name string) (float64, error) {
	resp, err := client.Get(api + "/v1/metrics/" + name)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return 0, fmt.Errorf("k6 API: %s", resp.Status)
	}
	var body struct {
		Data struct {
			Attributes struct {
				Sample map[string]float64 `json:"sample"`
			} `json:"attributes"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return 0, err
	}
	return body.Data.Attributes.Sample["count"], nil
}

// shellJoin quotes words for a POSIX shell where they need it.
func shellJoin(words []string) string {
	out := make([]string, len(words))
	for i, w := range words {
		if w != "" && strings.IndexFunc(w, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=,@%+", r))
		}) < 0 {
			out[i] = w
		} else {
			out[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
		}
	}
	return strings.Join(out, " ")
}
