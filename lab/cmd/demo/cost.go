package main

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/flashsale/stock/lab/report"
)

// component is one process class of a run and how to read the CPU each of
// its processes (or process trees) has used so far, always in the same
// order; err, when set, says why it is not measured.
type component struct {
	name      string
	processes int
	read      func() ([]time.Duration, error)
	err       error
}

// cpuSample is every component's CPU at one instant, with the load's
// answers so far (the caller's counts).
type cpuSample struct {
	at                      time.Time
	answered, sold          int64
	cpu                     [][]time.Duration // per component, per process
	errs                    []error
	machineBusy, machineAll time.Duration
}

// cpuMeter reads the components of one run.
type cpuMeter struct {
	components []component
}

// with returns a meter that reads c too (the load generator, known only
// once it runs).
func (m *cpuMeter) with(c component) *cpuMeter {
	return &cpuMeter{components: append(append([]component{}, m.components...), c)}
}

// replace puts c in place of the component of its name (the replicated
// servers for the single one), or adds it.
func (m *cpuMeter) replace(c component) {
	for i := range m.components {
		if m.components[i].name == c.name {
			m.components[i] = c
			return
		}
	}
	m.components = append(m.components, c)
}

func (m *cpuMeter) sample(answered, sold int64) cpuSample {
	s := cpuSample{at: time.Now(), answered: answered, sold: sold,
		cpu: make([][]time.Duration, len(m.components)), errs: make([]error, len(m.components))}
	for i, c := range m.components {
		if c.err != nil {
			s.errs[i] = c.err
			continue
		}
		s.cpu[i], s.errs[i] = c.read()
	}
	s.machineBusy, s.machineAll, _ = machineCPU()
	return s
}

// cost is what the load cost between two samples of the same meter.
func (m *cpuMeter) cost(a, b cpuSample, note string) *report.CPUCost {
	c := &report.CPUCost{Window: b.at.Sub(a.at), Answered: b.answered - a.answered, Sold: b.sold - a.sold, Note: note}
	if all := b.machineAll - a.machineAll; all > 0 {
		c.MachineBusy = float64(b.machineBusy-a.machineBusy) / float64(all)
		c.MachineCPU = b.machineBusy - a.machineBusy
	}
	for i, comp := range m.components {
		cc := report.ComponentCost{Name: comp.name, Processes: comp.processes}
		switch err := errorsOf(a.errs[i], b.errs[i]); {
		case err != nil:
			cc.Error = err.Error()
		case len(a.cpu[i]) != len(b.cpu[i]):
			cc.Error = "its processes changed during the window"
		default:
			for j := range b.cpu[i] {
				d := b.cpu[i][j] - a.cpu[i][j]
				cc.CPU += d
				cc.Busiest = max(cc.Busiest, d)
			}
		}
		c.Components = append(c.Components, cc)
	}
	return c
}

func errorsOf(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// costWindow picks, from samples taken while a load ran, the window of
// load: from the first sample with an answer to the first with every
// answer (whole), and to the first with every sale (selling). ok is false
// when the load was over within one sample.
func costWindow(samples []cpuSample) (start, sellEnd, end int, ok bool) {
	if len(samples) < 2 {
		return 0, 0, 0, false
	}
	start = -1
	last := samples[len(samples)-1]
	for i, s := range samples {
		if start < 0 && s.answered > 0 {
			start = i
		}
	}
	if start < 0 {
		return 0, 0, 0, false
	}
	end, sellEnd = len(samples)-1, len(samples)-1
	for i := len(samples) - 1; i >= start; i-- {
		if samples[i].answered == last.answered {
			end = i
		}
		if samples[i].sold == last.sold {
			sellEnd = i
		}
	}
	return start, sellEnd, end, end > start
}

// runCosts turns a load's samples into the run's costs: over every answer
// (cost) and over the selling (sellCost, until the last 201; nil when no
// order was sold). Without a window of load inside the samples (a burst
// over within one sample) the first and last samples stand in, and the
// note says that the start-up is in it.
func (m *cpuMeter) runCosts(samples []cpuSample, startup string) (cost, sellCost *report.CPUCost) {
	if len(samples) < 2 {
		return nil, nil
	}
	start, sellEnd, end, ok := costWindow(samples)
	if !ok {
		first, last := samples[0], samples[len(samples)-1]
		cost = m.cost(first, last, "the load was over within one sample: the window includes "+startup)
		if last.sold > 0 {
			sellCost = cost
		}
		return cost, sellCost
	}
	cost = m.cost(samples[start], samples[end], "")
	if samples[sellEnd].sold > samples[start].sold && sellEnd > start {
		sellCost = m.cost(samples[start], samples[sellEnd], "")
	}
	return cost, sellCost
}

// Component names, as the report shows them.
const (
	compService  = report.ComponentService
	compDatabase = report.ComponentDatabase
	compLoadGen  = report.ComponentLoadGen
)

// serviceComponent reads the fleet's instances.
func serviceComponent(f *fleet) component {
	var pids []int
	for _, in := range f.instances {
		pids = append(pids, in.cmd.Process.Pid)
	}
	return component{name: compService, processes: len(pids), read: func() ([]time.Duration, error) {
		var out []time.Duration
		for _, pid := range pids {
			s, err := readStat(pid)
			if err != nil {
				return nil, fmt.Errorf("instance %d: %w", pid, err)
			}
			out = append(out, s.User+s.System)
		}
		return out, nil
	}}
}

// selfComponent reads the demo's own process: the Go client's load
// generator runs in it.
func selfComponent() component {
	pid := os.Getpid()
	return component{name: compLoadGen, processes: 1, read: func() ([]time.Duration, error) {
		s, err := readStat(pid)
		return []time.Duration{s.User + s.System}, err
	}}
}

// serverComponent reads the servers at addrs, each a process tree (a
// postmaster and its backends, a mariadbd, a redis-server); keep, when
// set, picks the children that count (treeCPU).
func serverComponent(name string, pids []int, keep func(int) bool, err error) component {
	if err != nil {
		return component{name: name, err: err}
	}
	return component{name: name, processes: len(pids), read: func() ([]time.Duration, error) {
		var out []time.Duration
		for _, pid := range pids {
			t, err := treeCPU(pid, keep)
			if err != nil {
				return nil, fmt.Errorf("server process %d: %w", pid, err)
			}
			out = append(out, t)
		}
		return out, nil
	}}
}

// serverPIDs finds the processes listening on addrs (host:port, or URLs
// such as etcd's endpoints), once per address for the whole demo: the
// servers do not move while it runs.
func (d *demo) serverPIDs(addrs []string) ([]int, error) {
	if d.pids == nil {
		d.pids = map[string]pidLookup{}
	}
	var pids []int
	for _, a := range addrs {
		hostPort := a
		if u, err := url.Parse(a); err == nil && u.Host != "" {
			hostPort = u.Host
		}
		r, ok := d.pids[hostPort]
		if !ok {
			r.pid, r.err = listenerPID(hostPort)
			d.pids[hostPort] = r
		}
		if r.err != nil {
			return nil, r.err
		}
		pids = append(pids, r.pid)
	}
	return pids, nil
}

type pidLookup struct {
	pid int
	err error
}

// databaseKeep picks the server's children that are the backend's: on
// PostgreSQL the workers and the backends of the URL's database (the tests
// use other databases and schemas of the same server); nil for MariaDB,
// one process whose threads serve every client alike.
func databaseKeep(b backend) func(int) bool {
	u, err := url.Parse(b.URL)
	if b.Name != "postgres" || err != nil || strings.Trim(u.Path, "/") == "" {
		return nil
	}
	return pgKeepDatabase(strings.Trim(u.Path, "/"))
}

// databaseAddr is the host:port of a backend's URL.
func databaseAddr(b backend) (string, error) {
	u, err := url.Parse(b.URL)
	if err != nil {
		return "", fmt.Errorf("%s URL: %w", b.Name, err)
	}
	if u.Port() != "" {
		return u.Host, nil
	}
	port := "5432"
	if b.Name == "mysql" {
		port = "3306"
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}

// meter is the CPU meter of a run of strategy on b against f: the
// instances, the database server, and the strategy's Redis, etcd or
// ZooKeeper (the load generator is added by whoever runs it).
func (d *demo) meter(f *fleet, b backend, strategy string) *cpuMeter {
	m := &cpuMeter{components: []component{serviceComponent(f)}}
	var dbPIDs []int
	addr, err := databaseAddr(b)
	if err == nil {
		dbPIDs, err = d.serverPIDs([]string{addr})
	}
	m.components = append(m.components, serverComponent(compDatabase, dbPIDs, databaseKeep(b), err))
	for _, s := range []struct {
		name  string
		addrs []string
		uses  bool
	}{
		{report.ComponentRedis, d.reserveRedis, isReserved(strategy)},
		{report.ComponentRedis, d.redis, needsRedis(strategy) && !isReserved(strategy)},
		{report.ComponentEtcd, d.etcd, needsEtcd(strategy)},
		{report.ComponentZooKeeper, d.zk, needsZooKeeper(strategy)},
	} {
		if !s.uses {
			continue
		}
		if len(s.addrs) == 0 {
			m.components = append(m.components, component{name: s.name, err: fmt.Errorf("no server address")})
			continue
		}
		pids, err := d.serverPIDs(s.addrs)
		m.components = append(m.components, serverComponent(s.name, pids, nil, err))
	}
	return m
}

// childCPU reads a child's CPU while it runs, and its final figure once it
// has been waited for (its /proc entry is gone then).
type childCPU struct {
	pid   int
	final func() (time.Duration, bool)
}

func (c childCPU) read() ([]time.Duration, error) {
	if t, ok := c.final(); ok {
		return []time.Duration{t}, nil
	}
	s, err := readStat(c.pid)
	if err != nil {
		return nil, err
	}
	return []time.Duration{s.User + s.System}, nil
}

// k6Counts are the answers and sales of a k6 run from its REST API's
// metrics: flashsale.js counts every answer in one of its counters;
// healthz.js has only http_reqs.
func k6Counts(script string, counts map[string]float64) (answered, sold int64) {
	if strings.HasPrefix(script, "healthz") {
		return int64(counts["http_reqs"]), 0
	}
	sold = int64(counts["orders"])
	return sold + int64(counts["sold_out"]+counts["busy"]+counts["errors"]), sold
}

// costSampleEvery is how often the CPU is read while k6 runs: often enough
// that a burst of a few hundred milliseconds has several samples, seldom
// enough that reading /proc (a few hundred files) costs the machine under
// a percent of a core.
const costSampleEvery = 50 * time.Millisecond

// k6Samples are the CPU samples of one k6 run, each with k6's answer
// counts at that moment (its REST API, while it answers).
type k6Samples struct {
	meter   *cpuMeter
	script  string
	samples []cpuSample
	// k6CPU is k6's own CPU once it has exited, done whether it is set.
	k6CPU time.Duration
	done  bool
}

// newK6Samples meters k6 as the load generator together with the demo's
// own process, which drives it and takes these samples: both load the
// cores the service shares.
func newK6Samples(m *cpuMeter, pid int, script string) *k6Samples {
	s := &k6Samples{script: script}
	k6 := childCPU{pid: pid, final: func() (time.Duration, bool) { return s.k6CPU, s.done }}
	self := selfComponent()
	s.meter = m.with(component{name: compLoadGen, processes: 2, read: func() ([]time.Duration, error) {
		k, err := k6.read()
		if err != nil {
			return nil, fmt.Errorf("k6: %w", err)
		}
		d, err := self.read()
		if err != nil {
			return nil, fmt.Errorf("the demo: %w", err)
		}
		return append(k, d...), nil
	}})
	return s
}

// run samples until stop closes; the counts of a sample are the last ones
// k6 reported.
func (s *k6Samples) run(api string, stop <-chan struct{}) {
	client := &http.Client{Timeout: 200 * time.Millisecond}
	tick := time.NewTicker(costSampleEvery)
	defer tick.Stop()
	var answered, sold int64
	for {
		if counts, err := k6Counters(client, api); err == nil {
			answered, sold = k6Counts(s.script, counts)
		}
		s.samples = append(s.samples, s.meter.sample(answered, sold))
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

// exited records k6's CPU as the kernel reported it when k6 was waited for.
func (s *k6Samples) exited(cpu time.Duration) {
	s.k6CPU, s.done = cpu, true
}

// costs adds a last sample after k6's exit, with the summary's final
// counts, and returns the run's costs.
func (s *k6Samples) costs(summary *report.Summary) (cost, sellCost *report.CPUCost) {
	counts := map[string]float64{}
	for _, name := range []string{"http_reqs", "orders", "sold_out", "busy", "errors"} {
		counts[name] = float64(summary.Count(name))
	}
	answered, sold := k6Counts(s.script, counts)
	samples := append(s.samples, s.meter.sample(answered, sold))
	return s.meter.runCosts(samples, "k6's start-up and set-up")
}
