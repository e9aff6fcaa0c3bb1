package faults

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/flashsale/stock/lab/history"
)

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
