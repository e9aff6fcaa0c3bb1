package faults

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/flashsale/stock/internal/strategies"
)

// Verdict is the outcome of one run of a scenario.
type Verdict string

const (
	// VerdictOK: every check held.
	VerdictOK Verdict = "ok"
	// VerdictExpectedOversell: an unsafe configuration (FENCING=off)
	// oversold or broke linearizability, as it is expected to; shown, not
	// hidden, and not a failure of the suite.
	VerdictExpectedOversell Verdict = "expected-oversell"
	// VerdictDegraded: nothing was oversold or lost, but the service did not
	// do what the scenario expects of its availability (it did not recover
	// in time, or stopped selling while it should have kept on).
	VerdictDegraded Verdict = "degraded"
	// VerdictFailed: a safe configuration oversold, lost or invented an
	// order, or its history is not linearizable. The suite exits non-zero.
	VerdictFailed Verdict = "failed"
	// VerdictError: the run could not be carried out (a server did not
	// start...). The suite exits non-zero.
	VerdictError Verdict = "error"
	// VerdictSkipped: a binary the run needs is not installed.
	VerdictSkipped Verdict = "skipped"
)

// Report is the content of faults.json, and the fault suite's part of a
// demo report (lab/report reads it as it is: one schema for both).
type Report struct {
	// Version of this structure; bumped on incompatible changes.
	Version  int       `json:"version"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	// Short is true for the short form the tests run.
	Short bool `json:"short"`
	// Verdict is "failed" when any run's verdict is failed or error,
	// else "ok".
	Verdict Verdict  `json:"verdict"`
	Runs    []Result `json:"runs"`
	// Link is faults.md relative to the folder of a demo report that
	// quotes the run; the suite leaves it empty.
	Link string `json:"link,omitempty"`
}

// Duration is how long the suite ran, 0 when unknown.
func (r *Report) Duration() time.Duration {
	if r.Finished.IsZero() || r.Started.IsZero() || r.Finished.Before(r.Started) {
		return 0
	}
	return r.Finished.Sub(r.Started)
}

// FaultStrategy is the strategy a run put under its fault: its
// configuration's, else (a run read from faults.md, or saved before the
// configuration was) the segment of its name that names a strategy
// ("2-paused-holder/redlock/fencing-on"), else the one its scenario exists
// for ("7-etcd-leader-kill").
func (r Result) FaultStrategy() string {
	if r.Config.Strategy != "" {
		return r.Config.Strategy
	}
	for _, seg := range strings.Split(r.Name, "/") {
		if _, ok := strategies.Lookup(seg); ok {
			return seg
		}
	}
	scenario, _, _ := strings.Cut(r.Name, "/")
	switch {
	case strings.HasPrefix(scenario, "3-redlock-"):
		return strategies.NameRedlock
	case strings.HasPrefix(scenario, "7-etcd-"):
		return strategies.NameEtcdLock
	case strings.HasPrefix(scenario, "7-zk-"):
		return strategies.NameZKLock
	}
	return ""
}

// FaultUnsafe reports whether the run's configuration was one expected to
// oversell (FENCING=off), from its name when its configuration is not
// known.
func (r Result) FaultUnsafe() bool {
	if r.Config.Strategy != "" {
		return !r.Config.Safe
	}
	return slices.Contains(strings.Split(r.Name, "/"), "fencing-off")
}

// Result is one run of one scenario in one configuration.
type Result struct {
	// Scenario is the number of the scenario (1..13); Name is a
	// stable identifier of the run, e.g. "2-paused-holder/redlock/fencing-off".
	Scenario int     `json:"scenario"`
	Name     string  `json:"name"`
	Title    string  `json:"title"`
	Config   Config  `json:"config"`
	Verdict  Verdict `json:"verdict"`
	// Line is the verdict line the command prints.
	Line    string  `json:"line"`
	Figures Figures `json:"figures"`
	// Phases split the figures at the fault's events (by call time).
	Phases []Phase `json:"phases,omitempty"`
	// Events are the faults injected, in order, at seconds since the load
	// started.
	Events          []Event         `json:"events,omitempty"`
	Linearizability Linearizability `json:"linearizability"`
	Audits          []Audit         `json:"audits"`
	// Failures are the safety checks that did not hold (they make the
	// verdict failed, or expected-oversell for an unsafe configuration);
	// Warnings the availability expectations that did not (degraded).
	// Rates are the contended bursts of 3-redlock-down-rate, one per
	// case (all up, servers refusing or hung); for scenario 7's leader
	// kills, the load's windows before the kill, until a new leader and
	// after it (Buyers is then the requests of the window).
	Rates []RateCase `json:"rates,omitempty"`
	// Batches are the batches of a batched run (checkBatches).
	Batches *BatchFigures `json:"batches,omitempty"`
	// Catalog sums a catalog run (scenarios 9 and 10): its set-up, the
	// load after the fault, and the audit of every SKU, with the worst.
	// Audits then holds only the SKUs worth reading: every one that is not
	// exact (up to 50) and the 10 hottest.
	Catalog *CatalogFigures `json:"catalog,omitempty"`
	// Restart is a row of the restart table (scenario 10).
	Restart *RestartRow `json:"restart,omitempty"`
	// Lifecycle sums a run of scenario 11 (orders that come back), or of
	// scenario 12 (the same on a reservation strategy).
	Lifecycle *LifecycleFigures `json:"lifecycle,omitempty"`
	// Relay sums what scenario 12 did to the relay of returns to Redis
	// and what Redis and the database held at the end.
	Relay    *RelayFigures `json:"relay,omitempty"`
	Failures []string      `json:"failures,omitempty"`
	Warnings []string      `json:"warnings,omitempty"`
	Notes    []string      `json:"notes,omitempty"`
	// Error says why the run could not be carried out (error, skipped).
	Error           string  `json:"error,omitempty"`
	DurationSeconds float64 `json:"duration_seconds"`
	// Dir is where the run's logs (and porcupine's HTML, on failure) are,
	// relative to faults.json.
	Dir string `json:"dir,omitempty"`
}

// Config is the configuration of a run.
type Config struct {
	Engine   string `json:"engine"`   // postgres or mysql
	Strategy string `json:"strategy"` // STRATEGY
	// Safe is false for configurations that are expected to oversell
	// under the fault (FENCING=off).
	Safe          bool    `json:"safe"`
	Instances     int     `json:"instances"`
	RedisServers  int     `json:"redis_servers,omitempty"`
	EtcdMembers   int     `json:"etcd_members,omitempty"`      // etcd-lock's cluster
	ZKServers     int     `json:"zookeeper_servers,omitempty"` // zk-lock's ensemble (1: standalone)
	Fencing       string  `json:"fencing,omitempty"`           // on, off ("" for SQL strategies)
	LockTTL       string  `json:"lock_ttl,omitempty"`
	OrderTimeout  string  `json:"order_timeout"`
	Idempotency   bool    `json:"idempotency_keys"`
	SKUs          int     `json:"skus"`
	StockPerSKU   int64   `json:"stock_per_sku"`
	Rate          float64 `json:"rate_per_second"`
	Workers       int     `json:"workers"`
	LoadSeconds   float64 `json:"load_seconds"`
	ClientTimeout string  `json:"client_timeout"`
}

// Figures are the counts of a run (or of a phase of it).
type Figures struct {
	// Requests is HTTP attempts sent; Orders the orders clients wanted to
	// place (one user id each; with Idempotency-Keys one key each, retried
	// over several requests).
	Requests int `json:"requests"`
	Orders   int `json:"orders"`
	// Answers by kind (per request).
	Created     int `json:"created"`     // 201
	SoldOut     int `json:"sold_out"`    // 409
	Busy        int `json:"busy"`        // 503 busy: nothing deducted
	Unavailable int `json:"unavailable"` // 503 unavailable (backend down), incl. MayExist
	MayExist    int `json:"may_exist"`   // 503 unavailable whose commit outcome is unknown
	NoAnswer    int `json:"no_answer"`   // timeout, reset, EOF
	Refused     int `json:"refused"`     // connection refused (instance down)
	Other       int `json:"other"`       // any other status
	// Responses503 = Busy + Unavailable.
	Responses503 int `json:"responses_503"`
	// Unknown is orders whose outcome the client never learned (all
	// attempts unknown): they may or may not have happened.
	Unknown int `json:"unknown"`

	// The rest are for the whole run only.

	// OrderRows is the rows in the orders table at the end.
	OrderRows int `json:"order_rows,omitempty"`
	// UnitsSold is the units in order rows; OversoldUnits those beyond the
	// stock (sum over SKUs of max(0, ordered - initial)).
	UnitsSold     int64 `json:"units_sold,omitempty"`
	OversoldUnits int64 `json:"oversold_units"`
	// LostOrders: 201 answers without their order row. PhantomOrders:
	// rows of an order every attempt of which said nothing happened (or of
	// no order at all). UnseenOrders: rows whose 201 the client never saw
	// (its answer was lost: allowed for unknown outcomes only).
	// DuplicateOrders: extra rows of one order (one key or user id).
	LostOrders      int `json:"lost_orders"`
	PhantomOrders   int `json:"phantom_orders"`
	UnseenOrders    int `json:"unseen_orders"`
	DuplicateOrders int `json:"duplicate_orders"`
	// InFlightAtFault is requests to the faulted process that were in
	// flight when it was killed (scenarios 1 and 6): the bound of
	// UnseenOrders.
	InFlightAtFault *int `json:"in_flight_at_fault,omitempty"`
	// RecoverySeconds is from the end of the fault (the restart) to the
	// first 201 after it; null when not applicable or never.
	RecoverySeconds *float64 `json:"recovery_seconds"`
	// From the instances' /metrics at the end (lock strategies).
	FencedOffWrites *float64 `json:"fenced_off_writes,omitempty"`
	LocksLost       *float64 `json:"locks_lost,omitempty"`
	// SlowestSeconds is the longest any answered request took (scenario
	// 7's leader kills, where every wait must end at ORDER_TIMEOUT).
	SlowestSeconds *float64 `json:"slowest_answer_seconds,omitempty"`
	// LostWithRedisData: orders answered 201 before the reservation Redis
	// lost its data (8-reserve-redis-wiped) that were still in its stream,
	// not yet in the database: gone with it, as docs/design/reservation-durability.md says.
	LostWithRedisData *int `json:"lost_with_redis_data,omitempty"`
	// Dropped arrivals: the open-model load found every worker busy.
	Dropped int64 `json:"dropped_arrivals,omitempty"`
}

// RateCase is one case of 3-redlock-down-rate: contended bursts (one per
// round) of buyers at once on a fresh SKU of StockPerSKU units each, with
// Down of the five Redis servers refusing connections or hung.
type RateCase struct {
	Name  string `json:"name"`
	Fault string `json:"fault,omitempty"` // "refusing" or "hung"; "" with every server up
	Down  int    `json:"down"`
	// Buyers, Created (201s), Responses503 and Unknown are over all rounds.
	Buyers  int `json:"buyers"`
	Created int `json:"created"`
	// OrdersPerSecond is the median round's 201s over SellSeconds, from its
	// burst's start to its last 201; RoundRates every round's.
	SellSeconds     float64   `json:"sell_seconds"`
	OrdersPerSecond float64   `json:"orders_per_second"`
	RoundRates      []float64 `json:"round_orders_per_second"`
	// Ratio is OrdersPerSecond over the all-up case of the same run.
	Ratio        float64 `json:"ratio"`
	Responses503 int     `json:"responses_503"`
	Share503     float64 `json:"share_503"` // of Buyers
	Unknown      int     `json:"unknown"`   // orders of unknown outcome
}

// Phase is the figures of the orders called between two events.
type Phase struct {
	Name    string  `json:"name"`
	FromS   float64 `json:"from_s"`
	ToS     float64 `json:"to_s"`
	Figures Figures `json:"figures"`
}

// Event is a fault injected (or undone) at AtS seconds since the load began.
type Event struct {
	AtS  float64 `json:"at_s"`
	What string  `json:"what"`
}

// Linearizability is porcupine's verdict over every SKU of the run.
type Linearizability struct {
	// Result is "ok" (every SKU proven linearizable), "illegal" (some SKU
	// is not), "unknown" (the checker ran out of time on some SKU and found
	// nothing illegal) or "not-run".
	Result     string     `json:"result"`
	SKUs       int        `json:"skus"`
	Operations int        `json:"operations"`
	Seconds    float64    `json:"seconds"`
	NotOK      []SKUCheck `json:"not_ok,omitempty"`
}

// SKUCheck is the checker's answer for a SKU that is not proven
// linearizable.
type SKUCheck struct {
	SKU    string `json:"sku"`
	Result string `json:"result"`
	Reason string `json:"reason,omitempty"`
	// Visualization is porcupine's HTML, relative to faults.json.
	Visualization string `json:"visualization,omitempty"`
}

// verdictLine formats the line the command prints for a run.
func (r *Result) verdictLine() string {
	f := r.Figures
	var b strings.Builder
	fmt.Fprintf(&b, "%-9s %-48s requests=%d orders=%d 201=%d 503=%d unknown=%d oversold=%d lost=%d",
		strings.ToUpper(string(r.Verdict)), r.Name, f.Requests, f.Orders, f.Created, f.Responses503, f.Unknown,
		f.OversoldUnits, f.LostOrders)
	if f.RecoverySeconds != nil {
		fmt.Fprintf(&b, " recovery=%.2fs", *f.RecoverySeconds)
	}
	fmt.Fprintf(&b, " linearizable=%s", r.Linearizability.Result)
	if r.Error != "" {
		fmt.Fprintf(&b, " (%s)", firstLine(r.Error))
	}
	return b.String()
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// CatalogFigures sums a catalog run: many SKUs on sale, a load skewed
// towards a few hot ones, every SKU audited.
type CatalogFigures struct {
	SKUs int `json:"skus"`
	// Skew is the exponent of the load's Zipf-like distribution over the
	// SKUs; Hot10Share the share of the orders the 10 hottest took.
	Skew       float64 `json:"zipf_skew"`
	Hot10Share float64 `json:"hot10_share"`
	// SetupSeconds is how long putting the catalog on sale took
	// (PUT /admin/stock for each SKU, SetupWorkers at a time).
	SetupSeconds   float64 `json:"setup_seconds"`
	SetupWorkers   int     `json:"setup_workers"`
	SetupPerSecond float64 `json:"setup_sales_per_second"`
	// SetupRetries: sales started again after a failed PUT.
	SetupRetries int `json:"setup_retries,omitempty"`
	// MinStock and MaxStock: each SKU's stock is sized by its share of
	// the load, from the coldest's to the hottest's.
	MinStock int64 `json:"min_stock"`
	MaxStock int64 `json:"max_stock"`
	// SKUsOrdered: SKUs with at least one order in the run; SKUsSold with
	// at least one 201.
	SKUsOrdered int `json:"skus_ordered"`
	SKUsSold    int `json:"skus_sold"`
	// Audited is the sales audited (a SKU whose sale was started again
	// counts twice); Exact those whose every check held (SKUFigures).
	Audited int `json:"audited"`
	Exact   int `json:"exact"`
	// Worst is the sale furthest from exact (when every one is exact, the
	// most sold of them); Hottest the most ordered SKU's.
	Worst   *SKUFigures `json:"worst"`
	Hottest *SKUFigures `json:"hottest,omitempty"`
	// AfterFault is the load after the fault.
	AfterFault *AfterFault `json:"after_fault,omitempty"`
	// SalesChecked: after a Redis restart (redis-reserve, redis-watch),
	// the sales checked against the database, each as it was first
	// ordered; SalesCheckedAgain those checked more than once, MostChecks
	// the most checks of one sale (each stops the sale's orders while it
	// runs). Read from the stock rows' sale numbers, which each check
	// raises by one above the sale's start (a multiple of 2^20).
	SalesChecked      int `json:"sales_checked,omitempty"`
	SalesCheckedAgain int `json:"sales_checked_again,omitempty"`
	MostChecks        int `json:"most_checks,omitempty"`
	// Restarted: the SKUs whose sales were started again after Redis lost
	// its data, and how long that took.
	Restarted        int     `json:"restarted,omitempty"`
	RestartedSeconds float64 `json:"restarted_seconds,omitempty"`
}

// SKUFigures is one sale's audit beside its order rows and the answers its
// clients got.
type SKUFigures struct {
	SKU       string `json:"sku"`
	Initial   int64  `json:"initial"`
	Available int64  `json:"available"`
	// Ordered is what the audit says was ordered; RowUnits and Rows what
	// its order rows hold.
	Ordered  int64 `json:"ordered"`
	RowUnits int64 `json:"row_units"`
	Rows     int   `json:"rows"`
	// Created is the 201s its clients saw.
	Created  int   `json:"created"`
	Oversold int64 `json:"oversold"`
	// Lost: 201s without their row; LostWithRedis those of them answered
	// before the reservation Redis lost its data (allowed, counted).
	Lost          int `json:"lost"`
	LostWithRedis int `json:"lost_with_redis,omitempty"`
	// Phantom: rows of requests told nothing was ordered; Duplicate: extra
	// rows of one order.
	Phantom   int `json:"phantom"`
	Duplicate int `json:"duplicate"`
	// Consistent: the audit adds up (initial = available + ordered, and
	// the service's own consistency check).
	Consistent bool `json:"consistent"`
	// Exact: every check held.
	Exact bool `json:"exact"`
}

// AfterFault is the load from the end of a fault to the end of the run.
type AfterFault struct {
	// What the fault's end is, at FromS seconds of the load.
	What  string  `json:"what"`
	FromS float64 `json:"from_s"`
	// FirstCreatedS is from then to the end of the first 201 (null: none).
	FirstCreatedS *float64 `json:"first_created_s"`
	Requests      int      `json:"requests"`
	Created       int      `json:"created"`
	SoldOut       int      `json:"sold_out"`
	Responses503  int      `json:"responses_503"`
	// CreatedPerSecond is the 201s per second from then on;
	// CreatedPerSecondBefore those before the fault (the hot SKUs sell
	// out as the run goes on, so the two differ even without a fault).
	CreatedPerSecond       float64 `json:"created_per_second"`
	CreatedPerSecondBefore float64 `json:"created_per_second_before"`
	// SKUsOrdered: SKUs ordered from then on. Of each, the first order
	// then: answered 201 or 409 (the slowest and median times of those
	// answers), or not (SKUsFirstRefused, e.g. RefusedSKU answered
	// RefusedAnswer).
	SKUsOrdered         int     `json:"skus_ordered"`
	SlowestSKU          string  `json:"slowest_sku,omitempty"`
	SlowestFirstAnswerS float64 `json:"slowest_first_answer_s"`
	MedianFirstAnswerS  float64 `json:"median_first_answer_s"`
	// SKUsOverASecond: SKUs whose first order then took over a second to
	// be answered 201 or 409.
	SKUsOverASecond  int    `json:"skus_over_a_second"`
	SKUsFirstRefused int    `json:"skus_first_refused"`
	RefusedSKU       string `json:"refused_sku,omitempty"`
	RefusedAnswer    string `json:"refused_answer,omitempty"`
}

// RestartRow is one row of the restart table: a catalog of SKUs on sale on
// one instance, its durable Redis killed and started again from its
// append-only file, then one order every 0.3 s.
type RestartRow struct {
	Strategy string `json:"strategy"`
	SKUs     int    `json:"skus"`
	// SetupSeconds: putting the catalog on sale.
	SetupSeconds float64 `json:"setup_seconds"`
	// AOFBytes is the size of Redis's append-only files at the kill;
	// ReadyS how long the restarted Redis took to answer (it loads them).
	AOFBytes int64   `json:"aof_bytes"`
	ReadyS   float64 `json:"redis_ready_s"`
	// FirstCreatedS is from the restart to the end of the first 201 (null:
	// none within the bound), FirstCreatedAfterReadyS from the restarted
	// Redis answering; Refused503 the 503s before it.
	FirstCreatedS           *float64 `json:"first_created_s"`
	FirstCreatedAfterReadyS *float64 `json:"first_created_after_ready_s"`
	Refused503              int      `json:"refused_503"`
	// Then orders of other SKUs, each drawn from the whole catalog: how
	// many, how many were answered 201 or 409 at their first order, and
	// the slowest of those answers.
	OtherSKUs       int     `json:"other_skus"`
	OtherAnswered   int     `json:"other_answered"`
	OtherSlowestS   float64 `json:"other_slowest_s"`
	OtherSlowestSKU string  `json:"other_slowest_sku,omitempty"`
}
