package faults

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/flashsale/stock/internal/history"
	"github.com/flashsale/stock/internal/inventory"
)

// Env is what the scenarios need from their surroundings.
type Env struct {
	// Binary is the service (bin/stock), built without -race.
	Binary string
	// Dir is where each run gets a folder for its logs and, when a history
	// is not proven linearizable, porcupine's HTML.
	Dir string
	// NewDatabase returns the DATABASE_URL of a fresh, empty database of
	// the engine ("postgres" or "mysql") for one run.
	NewDatabase func(ctx context.Context, engine string) (string, error)
	// Postgres and MariaDB are private servers that scenario 5 crashes
	// and restarts; nil skips that run.
	Postgres, MariaDB *DBServer
	// Short selects the short forms (a few seconds of load each).
	Short bool
	// CatalogSKUs is the SKUs on sale in the catalog runs (scenario 9).
	// Default 10,000; short form 1,000.
	CatalogSKUs int
	// CheckTimeout bounds porcupine's search per SKU. Default 20s.
	CheckTimeout time.Duration
	// Logf reports progress. Default: nothing.
	Logf func(format string, args ...any)
}

func (e *Env) logf(format string, args ...any) {
	if e.Logf != nil {
		e.Logf(format, args...)
	}
}

// run is one run of a scenario: its cluster, its load, what it injected.
type run struct {
	env     *Env
	res     Result
	dir     string
	began   time.Time
	dbURL   string
	cluster *Cluster
	redis   []*redisNode
	coord   coordinator // the run's etcd cluster or ZooKeeper, if any
	load    *load
	initial map[string]int64
	// instanceEnv adds environment to some instances, by index.
	instanceEnv map[int][]string
	// afterLoad checks what only the scenario knows, once the load is over
	// (it may set inFlightBound and the recovery time).
	afterLoad func(orders []*order)
	// inFlightBound, when set, bounds the rows whose answer was lost.
	inFlightBound *int
	// afterRows checks what only the scenario knows of the order rows,
	// after the checks every run gets.
	afterRows func(orders []*order, rows []orderRow)
	// redisLostAt, when set, is when the reservation Redis went down to
	// come back without its data (8-reserve-redis-wiped). Its audit cannot
	// answer for the run's SKUs any more, so the database is checked on
	// its own; and a 201 answered to a call made before it may have no row
	// (its order was still in the stream), which is counted, not failed.
	redisLostAt *time.Duration
	// restarted, after redisLostAt, holds the SKUs whose sale the run
	// started again, with their new stock; before, what the database held
	// just before (the first sale's rows and stock rows, which the new
	// sale deletes). The orders of such a SKU called from the loss on
	// belong to its second sale (secondSale), audited in Redis and
	// checked apart from the first.
	restarted map[string]int64
	before    *dbSnapshot
	// cat is the catalog of a catalog run; perSKU its sales' figures.
	cat      *catalog
	perSKU   map[string]*SKUFigures
	cleanups []func()
}

// dbSnapshot is what the run's database held at a moment.
type dbSnapshot struct {
	rows  []orderRow
	keys  []keyRow
	stock map[string]stockRow
}

func (e *Env) newRun(scenario int, name, title string, cfg Config) *run {
	r := &run{env: e, began: time.Now(), initial: map[string]int64{}}
	r.res = Result{Scenario: scenario, Name: name, Title: title, Config: cfg}
	r.dir = filepath.Join(e.Dir, strings.NewReplacer("/", "_", " ", "_").Replace(name))
	r.res.Dir, _ = filepath.Rel(e.Dir, r.dir)
	e.logf("run %s: %s", name, title)
	return r
}

// setUp creates the run's folder and database and starts its Redis servers
// and its service instances.
func (r *run) setUp(ctx context.Context, redisServers int, env ...string) error {
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return err
	}
	if r.dbURL == "" {
		url, err := r.env.NewDatabase(ctx, r.res.Config.Engine)
		if err != nil {
			return fmt.Errorf("database: %w", err)
		}
		r.dbURL = url
	}
	if redisServers > 0 {
		nodes, err := startRedisNodes(redisServers)
		if err != nil {
			return err
		}
		r.redis = nodes
		r.cleanups = append(r.cleanups, func() { stopRedisNodes(nodes) })
		env = append(env, "REDIS_ADDRS="+redisAddrs(nodes))
	}
	env = append(env, "DATABASE_URL="+r.dbURL, "STRATEGY="+r.res.Config.Strategy,
		"ORDER_TIMEOUT="+r.res.Config.OrderTimeout)
	c, err := startCluster(ctx, r.env.Binary, r.dir, r.res.Config.Instances, r.instanceEnv, env...)
	if err != nil {
		return err
	}
	r.cluster = c
	r.cleanups = append(r.cleanups, c.Close)
	return nil
}

// startSales starts a sale of stock units for each SKU.
func (r *run) startSales(ctx context.Context, skus []string, stock int64) error {
	for _, sku := range skus {
		if err := r.cluster.StartSale(ctx, sku, stock); err != nil {
			return err
		}
		r.initial[sku] = stock
	}
	return nil
}

// startLoad starts the run's load against every instance.
func (r *run) startLoad(ctx context.Context, skus []string, spec loadSpec) {
	spec.userPrefix = "u" + randomHex(3)
	c := &r.res.Config
	c.Rate, c.Workers = spec.rate, spec.workers
	c.LoadSeconds, c.ClientTimeout, c.Idempotency = spec.duration.Seconds(), spec.timeout.String(), spec.idempotent
	r.load = startLoad(ctx, r.cluster.Instances, skus, spec)
}

// event records a fault at the load's clock and returns that time.
func (r *run) event(format string, args ...any) time.Duration {
	at := r.load.now()
	what := fmt.Sprintf(format, args...)
	r.res.Events = append(r.res.Events, Event{AtS: seconds(at), What: what})
	r.env.logf("  %6.2fs %s", seconds(at), what)
	return at
}

func (r *run) fail(format string, args ...any) {
	r.res.Failures = append(r.res.Failures, fmt.Sprintf(format, args...))
}

func (r *run) warn(format string, args ...any) {
	r.res.Warnings = append(r.res.Warnings, fmt.Sprintf(format, args...))
}

func (r *run) note(format string, args ...any) {
	r.res.Notes = append(r.res.Notes, fmt.Sprintf(format, args...))
}

// waitUntil polls cond every 10ms until it holds, ctx ends or timeout
// passes; it reports whether cond held.
func waitUntil(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	return true
}

// abort ends a run that could not be carried out.
func (r *run) abort(err error) Result {
	r.close()
	if r.load != nil {
		r.load.stop()
		r.load.wait()
	}
	r.res.Verdict = VerdictError
	if errors.Is(err, ErrMissing) || errors.Is(err, ErrUnavailable) {
		r.res.Verdict = VerdictSkipped
	}
	r.res.Error = err.Error()
	r.res.Linearizability.Result = "not-run"
	r.res.DurationSeconds = seconds(time.Since(r.began))
	r.res.Line = r.res.verdictLine()
	r.env.logf("%s", r.res.Line)
	return r.res
}

func (r *run) close() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	r.cleanups = nil
}

// finish waits for the load, checks everything, stops the run's processes
// and returns its result. Every instance must be running (not paused) when
// it is called.
func (r *run) finish(ctx context.Context, phases ...phaseMark) Result {
	r.load.wait()
	defer r.close()
	if err := r.check(ctx, phases); err != nil {
		return r.abort(err)
	}
	switch {
	case len(r.res.Failures) > 0 && r.res.Config.Safe:
		r.res.Verdict = VerdictFailed
	case len(r.res.Failures) > 0:
		r.res.Verdict = VerdictExpectedOversell
	case len(r.res.Warnings) > 0:
		r.res.Verdict = VerdictDegraded
	default:
		r.res.Verdict = VerdictOK
	}
	if !r.res.Config.Safe && len(r.res.Failures) == 0 {
		r.note("this configuration is unsafe, but no oversell was seen in this run")
	}
	r.res.DurationSeconds = seconds(time.Since(r.began))
	r.res.Line = r.res.verdictLine()
	r.env.logf("%s", r.res.Line)
	return r.res
}

// phaseMark starts a phase at a time of the load's clock.
type phaseMark struct {
	name string
	at   time.Duration
}

// check runs every check of the run: the audit of every SKU, every 201 an
// order row, no order row without its request, no order twice, and the
// history of every SKU linearizable.
func (r *run) check(ctx context.Context, marks []phaseMark) error {
	orders := r.load.snapshot()
	end := r.load.now()
	r.res.Config.SKUs = len(r.initial)

	// Figures, whole run and by phase.
	r.res.Figures = figures(orders, 0, end+time.Hour)
	r.res.Figures.Dropped = r.load.dropped.Load()
	if len(marks) > 0 {
		bounds := append([]phaseMark{{name: marks[0].name, at: 0}}, marks[1:]...)
		bounds[0].name = marks[0].name
		for i, m := range bounds {
			to := end
			if i+1 < len(bounds) {
				to = bounds[i+1].at
			}
			r.res.Phases = append(r.res.Phases, Phase{Name: m.name, FromS: seconds(m.at), ToS: seconds(to), Figures: figures(orders, m.at, to)})
		}
	}
	if o := r.res.Figures.Other; o > 0 {
		r.fail("%d answers were neither 201, 409 nor 503 (first: %s)", o, firstOther(orders))
	}

	// Lock metrics, from every instance (a restarted one counts from its
	// restart).
	if r.res.Config.Fencing != "" {
		var fenced, lost float64
		for _, in := range r.cluster.Instances {
			f, err1 := in.Counter(ctx, "stock_fenced_off_writes_total")
			l, err2 := in.Counter(ctx, "stock_locks_lost_total")
			if err := errors.Join(err1, err2); err != nil {
				r.note("metrics of instance %d: %v", in.Index, err)
			}
			fenced, lost = fenced+f, lost+l
		}
		r.res.Figures.FencedOffWrites, r.res.Figures.LocksLost = &fenced, &lost
	}

	if r.afterLoad != nil {
		r.afterLoad(orders)
	}

	// The audit of every SKU (of each sale of a SKU whose sale was
	// started again).
	initial := maps.Clone(r.initial)
	skus := slices.Sorted(maps.Keys(r.initial))
	auditOrdered := map[string]int64{}
	if r.redisLostAt == nil {
		audits, err := r.auditAll(ctx, skus, isReserved(r.res.Config.Strategy))
		if err != nil {
			return err
		}
		for _, sku := range skus {
			r.checkAudit(sku, audits[sku], initial[sku], auditOrdered)
		}
	} else {
		if err := r.checkDatabaseAlone(ctx, skus, auditOrdered); err != nil {
			return err
		}
		again := slices.Sorted(maps.Keys(r.restarted))
		audits, err := r.auditAll(ctx, again, true)
		if err != nil {
			return err
		}
		for _, sku := range again {
			sale := secondSale(sku)
			initial[sale] = r.restarted[sku]
			a := audits[sku]
			a.SKU = sale
			r.checkAudit(sale, a, initial[sale], auditOrdered)
		}
	}

	// Every 201 is an order row; no row without an order that may have
	// made it; no order twice.
	rows, keys, err := readRows(ctx, r.dbURL)
	if err != nil {
		return fmt.Errorf("read orders: %w", err)
	}
	ops := r.load.rec.Ops()
	if len(r.restarted) > 0 {
		orders, ops, rows, keys = r.splitSales(orders, ops, rows, keys)
	}
	r.checkRows(orders, rows, keys, auditOrdered)
	if r.afterRows != nil {
		r.afterRows(orders, rows)
	}

	// The history of every SKU.
	r.checkHistory(orders, ops, rows, end, initial)
	if r.cat != nil {
		r.summarizeCatalog(orders)
	}
	return nil
}

// checkAudit checks the audit of one sale, which started with initial
// units.
func (r *run) checkAudit(sale string, a Audit, initial int64, auditOrdered map[string]int64) {
	r.res.Audits = append(r.res.Audits, a)
	auditOrdered[sale] = a.Ordered
	f := r.skuFigures(sale)
	f.Initial, f.Available, f.Ordered = a.Initial, a.Available, a.Ordered
	f.Consistent = a.Consistent && a.Initial == a.Available+a.Ordered && a.Initial == initial
	if a.Initial != initial {
		r.fail("%s: initial stock %d, the sale started with %d", sale, a.Initial, initial)
	}
	if over := a.Ordered - a.Initial; over > 0 {
		f.Oversold = over
		r.res.Figures.OversoldUnits += over
		r.fail("%s: oversold %d units (initial %d, ordered %d, available %d)", sale, over, a.Initial, a.Ordered, a.Available)
	}
	if !a.Consistent || a.Initial != a.Available+a.Ordered {
		r.fail("%s: audit not consistent: %+v", sale, a)
	}
}

// splitSales renames, for each SKU whose sale was started again after
// Redis lost its data, what belongs to its second sale: the orders called
// from the loss on (the scenario leaves longer than any order takes
// between the loss and the new sale, so none called before can have been
// taken from it), their operations, and the rows the database holds now
// (the new sale deleted the first's). The first sale's rows are those the
// database held just before (r.before).
func (r *run) splitSales(orders []*order, ops []history.Op, rows []orderRow, keys []keyRow) ([]*order, []history.Op, []orderRow, []keyRow) {
	lost := *r.redisLostAt
	split := make([]*order, len(orders))
	for i, o := range orders {
		split[i] = o
		if _, again := r.restarted[o.sku]; again && o.call() >= lost {
			c := *o
			c.sku = secondSale(o.sku)
			split[i] = &c
		}
	}
	splitOps := make([]history.Op, len(ops))
	for i, op := range ops {
		if _, again := r.restarted[op.SKU]; again && op.Call >= int64(lost) {
			op.SKU = secondSale(op.SKU)
		}
		splitOps[i] = op
	}
	var splitRows []orderRow
	for _, row := range rows {
		if _, again := r.restarted[row.SKU]; again {
			row.SKU = secondSale(row.SKU)
		}
		splitRows = append(splitRows, row)
	}
	for _, row := range r.before.rows {
		if _, again := r.restarted[row.SKU]; again {
			splitRows = append(splitRows, row)
		}
	}
	splitKeys := slices.Clone(keys)
	for _, k := range r.before.keys {
		if !slices.ContainsFunc(keys, func(x keyRow) bool { return x.Key == k.Key }) {
			splitKeys = append(splitKeys, k)
		}
	}
	return split, splitOps, splitRows, splitKeys
}

func firstOther(orders []*order) string {
	for _, o := range orders {
		for _, a := range o.attempts {
			if a.answer == ansOther {
				return a.err
			}
		}
	}
	return ""
}

func (r *run) checkRows(orders []*order, rows []orderRow, keys []keyRow, auditOrdered map[string]int64) {
	f := &r.res.Figures
	f.OrderRows = len(rows)
	byUser := map[string][]orderRow{}
	byID := map[string]orderRow{}
	unitsBySKU := map[string]int64{}
	for _, row := range rows {
		byUser[row.UserID] = append(byUser[row.UserID], row)
		byID[row.ID] = row
		f.UnitsSold += row.Quantity
		unitsBySKU[row.SKU] += row.Quantity
		sf := r.skuFigures(row.SKU)
		sf.RowUnits += row.Quantity
		sf.Rows++
	}
	for sku, units := range unitsBySKU {
		if units != auditOrdered[sku] {
			r.fail("%s: order rows hold %d units, the audit says %d", sku, units, auditOrdered[sku])
		}
	}
	var lost, phantom, unseen, dup []string
	lostWithRedis := 0
	orderOf := map[string]*order{}
	for _, o := range orders {
		orderOf[o.userID] = o
		seen := map[string]bool{}
		for _, a := range o.attempts {
			if a.answer != ansCreated {
				continue
			}
			seen[a.orderID] = true
			r.skuFigures(o.sku).Created++
			row, ok := byID[a.orderID]
			if !ok && r.redisLostAt != nil && a.call < *r.redisLostAt {
				lostWithRedis++ // in the stream when Redis lost its data
				r.skuFigures(o.sku).LostWithRedis++
				continue
			}
			if !ok || row.UserID != o.userID || row.SKU != o.sku || row.Quantity != o.quantity {
				lost = append(lost, fmt.Sprintf("201 %s for %s (%d of %s) has no matching row", a.orderID, o.userID, o.quantity, o.sku))
				r.skuFigures(o.sku).Lost++
			}
		}
		if len(seen) > 1 {
			dup = append(dup, fmt.Sprintf("%s was answered 201 with %d different order ids", o.userID, len(seen)))
			r.skuFigures(o.sku).Duplicate++
		}
	}
	for user, rs := range byUser {
		if len(rs) > 1 {
			dup = append(dup, fmt.Sprintf("%s has %d order rows", user, len(rs)))
			f.DuplicateOrders += len(rs) - 1
			r.skuFigures(rs[0].SKU).Duplicate += len(rs) - 1
		}
		o := orderOf[user]
		for _, row := range rs {
			switch {
			case o == nil:
				phantom = append(phantom, fmt.Sprintf("row %s of %s belongs to no request", row.ID, user))
				r.skuFigures(row.SKU).Phantom++
			case o.outcome == history.OK && slices.ContainsFunc(o.attempts, func(a attempt) bool { return a.orderID == row.ID }):
			case o.outcome == history.Unknown:
				unseen = append(unseen, row.ID)
			default:
				phantom = append(phantom, fmt.Sprintf("row %s of %s, whose every answer said nothing was ordered (%s)", row.ID, user, answersOf(o)))
				r.skuFigures(row.SKU).Phantom++
			}
		}
	}
	for _, k := range keys {
		o := orderOf[strings.TrimPrefix(k.Key, "key-")]
		if o == nil || o.key != k.Key {
			phantom = append(phantom, fmt.Sprintf("idempotency key %s belongs to no request", k.Key))
			continue
		}
		if row, ok := byID[k.OrderID]; !ok || row.UserID != o.userID {
			r.fail("idempotency key %s points at order %s, which is not its order row", k.Key, k.OrderID)
		}
	}
	f.LostOrders, f.PhantomOrders, f.UnseenOrders = len(lost), len(phantom), len(unseen)
	if r.redisLostAt != nil {
		f.LostWithRedisData = &lostWithRedis
		r.note("%d orders answered 201 before Redis went down were still in its stream, not yet written, and were lost with its data", lostWithRedis)
	}
	if len(lost) > 0 {
		r.fail("%d orders answered 201 have no order row: %s", len(lost), sample(lost))
	}
	if len(phantom) > 0 {
		r.fail("%d order rows were made by requests that were told nothing was ordered: %s", len(phantom), sample(phantom))
	}
	if len(dup) > 0 {
		r.fail("%d orders were made more than once: %s", len(dup), sample(dup))
	}
	if r.inFlightBound != nil {
		f.InFlightAtFault = r.inFlightBound
		if len(unseen) > *r.inFlightBound {
			r.fail("%d order rows have no 201 a client saw, more than the %d requests in flight at the kill", len(unseen), *r.inFlightBound)
		}
	}
}

func answersOf(o *order) string {
	var s []string
	for _, a := range o.attempts {
		s = append(s, answerName[a.answer])
	}
	return strings.Join(s, ", ")
}

var answerName = map[answer]string{
	ansCreated: "201", ansSoldOut: "409", ansBusy: "503 busy", ansUnavailable: "503 unavailable",
	ansMayExist: "503 unavailable (may exist)", ansRefused: "refused", ansNoAnswer: "no answer", ansOther: "other",
}

func sample(s []string) string {
	if len(s) > 3 {
		return strings.Join(s[:3], "; ") + fmt.Sprintf("; and %d more", len(s)-3)
	}
	return strings.Join(s, "; ")
}

// checkHistory checks each SKU's history with porcupine. Operations with
// no effect (503 busy, refused connections) are left out: the model lets
// them happen anywhere without changing the stock, so they cannot make a
// history illegal and only slow the search.
//
// An order whose outcome the client never learned may have taken effect at
// any time after its call, which can make the search outgrow its time when
// there are many (a long stall). For a SKU whose check ran out of time, the
// history is checked again with those outcomes resolved from the order
// rows, which the run has already checked against every answer: no row,
// no effect; a row, an effect before the end of the run.
func (r *run) checkHistory(orders []*order, all []history.Op, rows []orderRow, end time.Duration, initial map[string]int64) {
	var ops []history.Op
	for _, op := range all {
		if op.Outcome != history.NoEffect {
			ops = append(ops, op)
		}
	}
	timeout := r.env.CheckTimeout
	if timeout == 0 {
		timeout = 20 * time.Second
	}
	lin := &r.res.Linearizability
	lin.Operations = len(ops)
	began := time.Now()
	defer func() { lin.Seconds = seconds(time.Since(began)) }()
	verdicts, err := history.Check(ops, initial, timeout, r.dir)
	if err != nil {
		lin.Result = "not-run"
		r.fail("history check: %v", err)
		return
	}
	lin.SKUs, lin.Result = len(verdicts), "ok"
	for _, v := range verdicts {
		if v.Linearizable() {
			continue
		}
		c := SKUCheck{SKU: v.SKU, Result: strings.ToLower(string(v.Result)), Reason: v.Reason}
		if v.Visualization != "" {
			c.Visualization, _ = filepath.Rel(r.env.Dir, v.Visualization)
		}
		if c.Result == "unknown" {
			if ok, err := checkResolved(v.SKU, orders, rows, end, timeout, initial[v.SKU]); err == nil && ok {
				if v.Visualization != "" {
					_ = os.Remove(v.Visualization) // kept only for histories that fail
				}
				r.note("%s: the check ran out of time (%v) on the raw history; with the unknown outcomes resolved from the "+
					"order rows it is linearizable", v.SKU, timeout)
				continue
			}
		}
		lin.NotOK = append(lin.NotOK, c)
		if c.Result == "illegal" {
			lin.Result = "illegal"
			r.fail("%s: history not linearizable (%s)%s", v.SKU, v.Reason, seeFile(c.Visualization))
		} else if lin.Result == "ok" {
			lin.Result = "unknown"
			r.note("%s: the checker ran out of time (%v): linearizability not proven%s", v.SKU, timeout, seeFile(c.Visualization))
		}
	}
}

// checkDatabaseAlone audits the run's SKUs from the database's stock rows,
// for a run whose reservation Redis lost its data: no oversell, the sale
// as started, and (through auditOrdered, which checkRows compares with the
// order rows) every unit the stock row lost is in an order row. A SKU
// whose sale was started again is audited so for its first sale, from the
// stock row the database held just before (r.before).
func (r *run) checkDatabaseAlone(ctx context.Context, skus []string, auditOrdered map[string]int64) error {
	stock, err := readStock(ctx, r.dbURL)
	if err != nil {
		return fmt.Errorf("read the stock rows: %w", err)
	}
	for _, sku := range skus {
		row, ok := stock[sku]
		if _, again := r.restarted[sku]; again {
			row, ok = r.before.stock[sku]
		}
		if !ok {
			r.fail("%s: no stock row in the database", sku)
			continue
		}
		a := Audit{SKU: sku, Initial: row.initial, Available: row.available, Ordered: row.initial - row.available, Orders: row.orders}
		a.Consistent = a.Available >= 0
		r.res.Audits = append(r.res.Audits, a)
		auditOrdered[sku] = a.Ordered
		f := r.skuFigures(sku)
		f.Initial, f.Available, f.Ordered = a.Initial, a.Available, a.Ordered
		f.Consistent = a.Consistent && a.Initial == r.initial[sku]
		if a.Initial != r.initial[sku] {
			r.fail("%s: initial stock %d in the database, the sale started with %d", sku, a.Initial, r.initial[sku])
		}
		if a.Available < 0 {
			f.Oversold = -a.Available
			r.res.Figures.OversoldUnits -= a.Available
			r.fail("%s: the database's stock row is oversold by %d units", sku, -a.Available)
		}
	}
	return nil
}

// snapshotDatabase reads what the run's database holds now.
func (r *run) snapshotDatabase(ctx context.Context) (*dbSnapshot, error) {
	rows, keys, err := readRows(ctx, r.dbURL)
	if err != nil {
		return nil, fmt.Errorf("read orders: %w", err)
	}
	stock, err := readStock(ctx, r.dbURL)
	if err != nil {
		return nil, fmt.Errorf("read the stock rows: %w", err)
	}
	return &dbSnapshot{rows: rows, keys: keys, stock: stock}, nil
}

// checkResolved checks sku's history with every unknown outcome replaced by
// what the order rows say.
func checkResolved(sku string, orders []*order, rows []orderRow, end time.Duration, timeout time.Duration, initial int64) (bool, error) {
	hasRow := map[string]bool{}
	for _, row := range rows {
		hasRow[row.UserID] = true
	}
	var ops []history.Op
	for _, o := range orders {
		if o.sku != sku {
			continue
		}
		op := history.Op{Client: o.worker, SKU: sku, Quantity: o.quantity, Call: int64(o.call()), Return: int64(o.ret()), Outcome: o.outcome}
		switch o.outcome {
		case history.NoEffect:
			continue
		case history.Unknown:
			if !hasRow[o.userID] {
				continue
			}
			op.Outcome, op.Return = history.OK, int64(end)
		}
		ops = append(ops, op)
	}
	v, err := history.Check(ops, map[string]int64{sku: initial}, timeout, "")
	if err != nil || len(v) != 1 {
		return false, err
	}
	return v[0].Linearizable(), nil
}

func seeFile(path string) string {
	if path == "" {
		return ""
	}
	return ", see " + path
}

// figures counts the attempts called in [from, to) and the orders whose
// first attempt was.
func figures(orders []*order, from, to time.Duration) Figures {
	var f Figures
	for _, o := range orders {
		if c := o.call(); c >= from && c < to {
			f.Orders++
			if o.outcome == history.Unknown {
				f.Unknown++
			}
		}
		for _, a := range o.attempts {
			if a.call < from || a.call >= to {
				continue
			}
			f.Requests++
			switch a.answer {
			case ansCreated:
				f.Created++
			case ansSoldOut:
				f.SoldOut++
			case ansBusy:
				f.Busy++
			case ansUnavailable:
				f.Unavailable++
			case ansMayExist:
				f.Unavailable++
				f.MayExist++
			case ansRefused:
				f.Refused++
			case ansNoAnswer:
				f.NoAnswer++
			default:
				f.Other++
			}
		}
	}
	f.Responses503 = f.Busy + f.Unavailable
	return f
}

// recovery is the time from at to the end of the first 201 answered to a
// request called at or after it (by instance, or by any when instance is
// -1); nil if there was none.
func recovery(orders []*order, at time.Duration, instance int) *float64 {
	best := time.Duration(-1)
	for _, o := range orders {
		for _, a := range o.attempts {
			if a.answer == ansCreated && a.call >= at && (instance < 0 || a.instance == instance) {
				if d := a.ret - at; best < 0 || d < best {
					best = d
				}
			}
		}
	}
	if best < 0 {
		return nil
	}
	s := seconds(best)
	return &s
}

// inFlight counts the attempts to instance that were sent before t1 and had
// not been answered at t0 (the kill was sent at t0 and was over at t1).
func inFlight(orders []*order, instance int, t0, t1 time.Duration) int {
	n := 0
	for _, o := range orders {
		for _, a := range o.attempts {
			if a.instance == instance && a.call < t1 && a.ret > t0 && a.answer != ansRefused {
				n++
			}
		}
	}
	return n
}

func seconds(d time.Duration) float64 {
	return float64(d.Round(time.Millisecond)) / float64(time.Second)
}

// isReserved: the strategy counts stock in Redis and writes orders to the
// database afterwards (redis-reserve, redis-watch).
func isReserved(strategy string) bool {
	return strategy == inventory.NameRedisReserve || strategy == inventory.NameRedisWatch
}

// startReservationRedis starts the run's durable Redis for the reserved
// strategies and returns the REDIS_ADDRS that points at it.
func (r *run) startReservationRedis() (string, error) {
	node, err := startDurableRedisNode()
	if err != nil {
		return "", err
	}
	r.redis = append(r.redis, node)
	r.cleanups = append(r.cleanups, func() { stopRedisNodes([]*redisNode{node}) })
	return "REDIS_ADDRS=" + node.Addr, nil
}
