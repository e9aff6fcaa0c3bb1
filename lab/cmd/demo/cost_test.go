package main

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseStatCountsFieldsAfterTheLastParenthesis(t *testing.T) {
	// A command with a space and a ")" in it, as a process may name itself.
	line := "2247 (post gres) x) S 1 2247 2247 0 -1 4194304 16110 639068 0 16 29 139 2585 2727 20 0 1 0 5075 222543872 7595"
	s, err := parseStat(line)
	if err != nil {
		t.Fatal(err)
	}
	want := procStat{PPID: 1, User: 290 * time.Millisecond, System: 1390 * time.Millisecond, ChildUser: 25850 * time.Millisecond, ChildSystem: 27270 * time.Millisecond}
	if s != want {
		t.Errorf("parseStat = %+v, want %+v", s, want)
	}
	if _, err := parseStat("12 (short) S 1 2"); err == nil {
		t.Error("a truncated line parsed")
	}
}

func TestReadStatOfThisProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc on this system")
	}
	s, err := readStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if s.PPID != os.Getppid() {
		t.Errorf("PPID = %d, want %d", s.PPID, os.Getppid())
	}
}

func TestListenInodesFindsOnlyListeningSocketsOnThePort(t *testing.T) {
	table := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1538 00000000:0000 0A 00000000:00000000 00:00000000 00000000   106        0 7483 1 0000000064dce36f 100 0 0 10 0
   1: 0100007F:0CEA 00000000:0000 0A 00000000:00000000 00:00000000 00000000   108        0 6690 1 000000009e7f0ef5 100 0 0 10 0
   2: 0100007F:1538 0100007F:D2A4 01 00000000:00000000 00:00000000 00000000   106        0 9911 1 000000009e7f0ef5 100 0 0 10 0
`
	got, err := listenInodes(strings.NewReader(table), 5432)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != "7483" {
		t.Errorf("listenInodes(5432) = %v, want [7483] (the established connection is not a listener)", got)
	}
}

func TestParseMachineCPUExcludesIdleAndIOWait(t *testing.T) {
	busy, total, err := parseMachineCPU("cpu  100 5 50 800 40 3 2 0 0 0\n")
	if err != nil {
		t.Fatal(err)
	}
	if busy != 1600*time.Millisecond || total != 10000*time.Millisecond {
		t.Errorf("busy %s of %s, want 1.6s of 10s", busy, total)
	}
}

// fakeMeter is a meter of one component whose readings the test sets.
func fakeMeter(readings *[]time.Duration) *cpuMeter {
	return &cpuMeter{components: []component{{name: compService, processes: 2,
		read: func() ([]time.Duration, error) { return append([]time.Duration{}, *readings...), nil }}}}
}

func TestCostWindowRunsFromTheFirstAnswerToTheLastOfEachKind(t *testing.T) {
	s := func(answered, sold int64) cpuSample { return cpuSample{answered: answered, sold: sold} }
	// Start-up, selling, the sold-out tail, teardown.
	samples := []cpuSample{s(0, 0), s(0, 0), s(40, 40), s(300, 300), s(700, 300), s(1200, 300), s(1200, 300)}
	start, sellEnd, end, ok := costWindow(samples)
	if !ok || start != 2 || sellEnd != 3 || end != 5 {
		t.Errorf("costWindow = %d, %d, %d, %v; want 2, 3, 5, true", start, sellEnd, end, ok)
	}
	// Over within one sample: no window of its own.
	if _, _, _, ok := costWindow([]cpuSample{s(0, 0), s(300, 300), s(300, 300)}); ok {
		t.Error("a load over within one sample has a window")
	}
}

func TestRunCostsDividesEachWindowByItsOwnAnswers(t *testing.T) {
	var readings []time.Duration
	m := fakeMeter(&readings)
	at := time.Now()
	var samples []cpuSample
	for i, step := range []struct {
		cpu            []time.Duration
		answered, sold int64
	}{
		{[]time.Duration{time.Second, time.Second}, 0, 0},       // k6 starting
		{[]time.Duration{2 * time.Second, time.Second}, 10, 10}, // the first answers
		{[]time.Duration{3 * time.Second, 2 * time.Second}, 110, 110},
		{[]time.Duration{3 * time.Second, 3 * time.Second}, 410, 110}, // sold out
	} {
		readings = step.cpu
		sm := m.sample(step.answered, step.sold)
		sm.at = at.Add(time.Duration(i) * time.Second)
		samples = append(samples, sm)
	}
	cost, sell := m.runCosts(samples, "start-up")
	if cost.Answered != 400 || cost.Sold != 100 || cost.Window != 2*time.Second {
		t.Errorf("cost: %d answered, %d sold in %s; want 400, 100 in 2s", cost.Answered, cost.Sold, cost.Window)
	}
	if c := cost.Components[0]; c.CPU != 3*time.Second || c.Busiest != 2*time.Second {
		t.Errorf("whole window: CPU %s, busiest %s; want 3s, 2s", c.CPU, c.Busiest)
	}
	if sell == nil || sell.Sold != 100 || sell.Components[0].CPU != 2*time.Second {
		t.Errorf("selling window = %+v, want 100 sold for 2s of CPU", sell)
	}
	if cost.Note != "" {
		t.Errorf("note %q on a window that was found", cost.Note)
	}
}

func TestRunCostsWithoutAWindowSaysTheStartUpIsIn(t *testing.T) {
	var readings = []time.Duration{0}
	m := fakeMeter(&readings)
	first := m.sample(0, 0)
	readings = []time.Duration{time.Second}
	last := m.sample(300, 300)
	cost, sell := m.runCosts([]cpuSample{first, last}, "k6's start-up")
	if cost == nil || sell == nil || cost.Answered != 300 || !strings.Contains(cost.Note, "k6's start-up") {
		t.Errorf("cost = %+v, sell = %+v; want the whole run, noted", cost, sell)
	}
}

func TestComponentNotFoundIsNotMeasuredRatherThanAFailure(t *testing.T) {
	m := &cpuMeter{components: []component{serverComponent(compDatabase, nil, nil, errNotFound)}}
	a, b := m.sample(0, 0), m.sample(10, 10)
	c := m.cost(a, b, "")
	if c.Components[0].Measured() || c.Components[0].Error == "" {
		t.Errorf("component = %+v, want not measured with its reason", c.Components[0])
	}
}

func TestK6CountsAnswersOfEveryKind(t *testing.T) {
	counts := map[string]float64{"http_reqs": 1300, "orders": 300, "sold_out": 890, "busy": 7, "errors": 3}
	if a, s := k6Counts("flashsale.js", counts); a != 1200 || s != 300 {
		t.Errorf("flashsale: %d answered, %d sold; want 1200, 300", a, s)
	}
	if a, s := k6Counts("healthz.js", counts); a != 1300 || s != 0 {
		t.Errorf("healthz: %d answered, %d sold; want 1300, 0", a, s)
	}
}

func TestDatabaseAddrDefaultsTheEnginesPort(t *testing.T) {
	for _, c := range []struct {
		b    backend
		want string
	}{
		{backend{"postgres", "postgres://postgres@127.0.0.1:5432/stock?sslmode=disable"}, "127.0.0.1:5432"},
		{backend{"mysql", "mysql://root@127.0.0.1/stock"}, "127.0.0.1:3306"},
	} {
		if got, err := databaseAddr(c.b); err != nil || got != c.want {
			t.Errorf("databaseAddr(%s) = %q, %v; want %q", c.b.URL, got, err, c.want)
		}
	}
}

func TestListenerPIDRefusesAnotherHost(t *testing.T) {
	if _, err := listenerPID("10.1.2.3:6379"); err == nil {
		t.Error("a server on another host was looked up")
	}
}

func TestPGBackendDatabaseTellsClientsFromWorkers(t *testing.T) {
	for _, c := range []struct {
		title, db string
		client    bool
	}{
		{"postgres: 15/main: postgres stock 127.0.0.1(60306) idle in transaction", "stock", true},
		{"postgres: postgres stock_test_x [local] SELECT", "stock_test_x", true},
		{"postgres: 15/main: checkpointer ", "", false},
		{"postgres: 15/main: autovacuum worker stock", "", false},
	} {
		if db, client := pgBackendDatabase(c.title); db != c.db || client != c.client {
			t.Errorf("pgBackendDatabase(%q) = %q, %v; want %q, %v", c.title, db, client, c.db, c.client)
		}
	}
}
