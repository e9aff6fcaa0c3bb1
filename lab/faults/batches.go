package faults

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// batchMax is the service's default BATCH_MAX (the scenarios do not set
// it): no transaction may hold more orders.
const batchMax = 256

// openTx is a transaction of the killed instance that was open in the
// database when it was killed, as the database shows it.
type openTx struct {
	// ID is PostgreSQL's backend_xid ("" before its first write) or
	// InnoDB's trx_id.
	ID string
	// Wrote: it had written (deducted stock, maybe inserted its orders).
	Wrote bool
	// Active: a statement of it was still running (or waiting for a lock).
	Active bool
	// RowsModified is InnoDB's count of rows it had written (the stock row
	// and its orders); -1 on PostgreSQL, which does not show it.
	RowsModified int64
	// Last is its last statement (PostgreSQL), for the report.
	Last string
}

// catchMidBatch stops the instance (SIGSTOP) at a moment it has a batch
// transaction open in the database with writes done, as far as the
// database shows: its sessions are found by their client ports, which the
// stopped process's sockets name. A stopped process sends nothing more, so
// once its running statements are over (settled), its open transactions
// can neither commit nor go on: killing it now kills it mid-batch. When it
// has none, it goes on for a moment and is stopped again, for up to budget
// (on MariaDB, where a batch spends most of its time in its COMMIT, this
// can take dozens of tries). It returns with the instance stopped, the
// time it was stopped at (on now's clock), the transactions it had open,
// and the tries it took.
func catchMidBatch(ctx context.Context, in *Instance, dbURL string, now func() time.Duration, budget time.Duration) ([]openTx, time.Duration, int, error) {
	watch, err := newTxWatch(ctx, dbURL)
	if err != nil {
		return nil, 0, 0, err
	}
	defer watch.close()
	var (
		open      []openTx
		stoppedAt time.Duration
	)
	until := now() + budget
	for try := 1; ; try++ {
		open, stoppedAt = nil, now()
		if err := in.Pause(); err != nil {
			return nil, 0, try, err
		}
		ports, err := socketPorts(in.p.pid())
		if err != nil {
			return nil, 0, try, err
		}
		// Settled: no statement running, in two snapshots 10ms apart that
		// agree (a COMMIT the process sent just before it stopped, not yet
		// read by the server, would show in the second).
		var qerr error
		var prev []openTx
		polls := 0
		settled := waitUntil(ctx, 3*time.Second, func() bool {
			prev, open = open, nil
			open, qerr = watch.open(ctx, ports)
			polls++
			return qerr == nil && !slices.ContainsFunc(open, func(t openTx) bool { return t.Active }) &&
				polls > 1 && slices.Equal(prev, open)
		})
		if qerr != nil {
			return nil, 0, try, qerr
		}
		if !settled {
			open = nil // what it saw may still commit: claim nothing
		}
		if slices.ContainsFunc(open, func(t openTx) bool { return t.Wrote }) || now() >= until || ctx.Err() != nil {
			return open, stoppedAt, try, ctx.Err()
		}
		if err := in.Resume(); err != nil {
			return nil, 0, try, err
		}
		pause(ctx, time.Duration(5+rand.IntN(40))*time.Millisecond)
	}
}

// socketPorts returns the local TCP ports of the sockets process pid has
// open (Linux: its fds name socket inodes, its net/tcp{,6} their ports).
func socketPorts(pid int) (map[int]bool, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(dir, fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	ports := map[int]bool{}
	for _, table := range []string{"tcp", "tcp6"} {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || !inodes[f[9]] {
				continue
			}
			local := f[1] // hex address:hex port
			if p, err := strconv.ParseUint(local[strings.LastIndexByte(local, ':')+1:], 16, 16); err == nil {
				ports[int(p)] = true
			}
		}
	}
	return ports, nil
}

// txWatch lists the transactions open in the run's database on sessions
// whose client port is in a set, over one connection of its own. Each
// engine gets its own SQL.
type txWatch struct {
	pg *pgx.Conn
	my *sql.DB
}

func newTxWatch(ctx context.Context, dbURL string) (*txWatch, error) {
	if engineOf(dbURL) == "postgres" {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dbURL)
		return &txWatch{pg: conn}, err
	}
	db, err := openMySQL(dbURL)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	return &txWatch{my: db}, nil
}

func (w *txWatch) close() {
	if w.pg != nil {
		_ = w.pg.Close(context.Background())
	}
	if w.my != nil {
		_ = w.my.Close()
	}
}

// open lists them, sorted, so that two snapshots compare.
func (w *txWatch) open(ctx context.Context, ports map[int]bool) ([]openTx, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var open []openTx
	var err error
	if w.pg != nil {
		open, err = openTransactionsPostgres(ctx, w.pg, ports)
	} else {
		open, err = openTransactionsMySQL(ctx, w.my, ports)
	}
	slices.SortFunc(open, func(a, b openTx) int {
		return cmp.Or(strings.Compare(a.ID, b.ID), strings.Compare(a.Last, b.Last), cmp.Compare(a.RowsModified, b.RowsModified))
	})
	return open, err
}

func openTransactionsPostgres(ctx context.Context, conn *pgx.Conn, ports map[int]bool) ([]openTx, error) {
	rows, err := conn.Query(ctx, `
		SELECT client_port, state, COALESCE(backend_xid::text, ''), left(regexp_replace(query, '\s+', ' ', 'g'), 60)
		FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND client_port IS NOT NULL
		  AND state IS NOT NULL AND state <> 'idle'`)
	if err != nil {
		return nil, err
	}
	var open []openTx
	for rows.Next() {
		var port int
		var state, xid, last string
		if err := rows.Scan(&port, &state, &xid, &last); err != nil {
			rows.Close()
			return nil, err
		}
		if ports[port] {
			open = append(open, openTx{ID: xid, Wrote: xid != "", Active: state == "active", RowsModified: -1, Last: strings.TrimSpace(last)})
		}
	}
	return open, rows.Err()
}

func openTransactionsMySQL(ctx context.Context, db *sql.DB, ports map[int]bool) ([]openTx, error) {
	rows, err := db.QueryContext(ctx, `
		SELECT p.HOST, p.COMMAND, t.trx_id, COALESCE(t.trx_rows_modified, 0)
		FROM information_schema.PROCESSLIST p
		LEFT JOIN information_schema.INNODB_TRX t ON t.trx_mysql_thread_id = p.ID
		WHERE p.DB = DATABASE() AND p.ID <> CONNECTION_ID()`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var open []openTx
	for rows.Next() {
		var host, command string
		var trx sql.NullString
		var modified int64
		if err := rows.Scan(&host, &command, &trx, &modified); err != nil {
			return nil, err
		}
		port, err := strconv.Atoi(host[strings.LastIndexByte(host, ':')+1:])
		if err != nil || !ports[port] {
			continue
		}
		active := command == "Query"
		if !trx.Valid && !active {
			continue // an idle connection of the pool
		}
		open = append(open, openTx{ID: trx.String, Wrote: modified > 0, Active: active, RowsModified: modified})
	}
	return open, rows.Err()
}

// BatchFigures are the batches of a batched run, read from the order rows:
// the rows one transaction inserted are one batch that committed.
type BatchFigures struct {
	// Transactions that inserted order rows, the rows they inserted, how
	// many held more than one order, the largest and the mean.
	Transactions int     `json:"transactions"`
	Orders       int     `json:"orders"`
	MultiOrder   int     `json:"multi_order"`
	Largest      int     `json:"largest"`
	Mean         float64 `json:"mean"`
	// VictimMultiOrder: transactions of more than one order that the
	// killed instance committed before it was killed.
	VictimMultiOrder int `json:"victim_multi_order"`
	// CaughtOpen: the killed instance's transactions that had written and
	// were open in the database when it was killed.
	CaughtOpen int `json:"caught_open"`
	// InFlightWithRow and InFlightWithoutRow split the killed instance's
	// requests that never got an answer: committed (their answer was
	// lost) or not.
	InFlightWithRow    int `json:"in_flight_with_row"`
	InFlightWithoutRow int `json:"in_flight_without_row"`
}

// checkBatches checks, from the order rows, that each batch of the batched
// strategy committed whole or not at all, as far as it can be observed
// without anything the service does not have in production. Grouped by
// the transaction that inserted them, the rows of one transaction must be
// one batch: orders sent to one instance (batches form inside a process;
// a lane's batch takes orders of any SKU), at most BATCH_MAX of them, and
// overlapping in time: every one
// of its orders was sent before any of them was answered (a batch commits
// at one instant, after all its orders arrived and before any is
// answered). The rest of "whole" is checked for every run: a 201 without
// its row, a row of a request told 409 or 503 (a batch-mate's), units
// deducted without rows or rows without units (the audit). "Not at all"
// is checked on the batches the killed instance had open (caught): no row
// of such a transaction exists (PostgreSQL names it), or (MySQL, which
// names only the statement) the killed instance's unanswered requests
// without a row are at least as many as the orders those transactions had
// written. victim is the killed instance, stoppedAt and killedAt the
// fault's span on the load's clock.
func (r *run) checkBatches(orders []*order, rows []orderRow, victim int, stoppedAt, killedAt time.Duration, caught []openTx) {
	orderOf := map[string]*order{}
	for _, o := range orders {
		orderOf[o.userID] = o
	}
	// The attempt that made an order's row: its 201, else its only attempt.
	made := func(o *order) *attempt {
		for i := range o.attempts {
			if o.attempts[i].answer == ansCreated {
				return &o.attempts[i]
			}
		}
		if len(o.attempts) == 1 {
			return &o.attempts[0]
		}
		return nil
	}
	byTx := map[string][]orderRow{}
	for _, row := range rows {
		byTx[row.Tx] = append(byTx[row.Tx], row)
	}
	f := &BatchFigures{Transactions: len(byTx), Orders: len(rows), CaughtOpen: len(caught)}
	var bad []string
	for tx, rs := range byTx {
		f.Largest = max(f.Largest, len(rs))
		if len(rs) > 1 {
			f.MultiOrder++
		}
		if len(rs) > batchMax {
			bad = append(bad, fmt.Sprintf("transaction %s holds %d orders, more than BATCH_MAX %d", tx, len(rs), batchMax))
		}
		instances := map[int]bool{}
		lastCall, firstAnswer := time.Duration(-1), time.Duration(-1)
		var lastCalled, firstAnswered string
		for _, row := range rs {
			o := orderOf[row.UserID]
			if o == nil {
				continue // a phantom: checkRows fails it
			}
			a := made(o)
			if a == nil {
				continue
			}
			instances[a.instance] = true
			if a.call > lastCall {
				lastCall, lastCalled = a.call, row.UserID
			}
			if a.answer == ansCreated && (firstAnswer < 0 || a.ret < firstAnswer) {
				firstAnswer, firstAnswered = a.ret, row.UserID
			}
		}
		if len(instances) > 1 {
			bad = append(bad, fmt.Sprintf("transaction %s holds orders sent to %d instances", tx, len(instances)))
		}
		if firstAnswer >= 0 && lastCall >= firstAnswer {
			bad = append(bad, fmt.Sprintf("transaction %s: order of %s was answered 201 at %.3fs, before order of %s of the same transaction was sent (%.3fs)",
				tx, firstAnswered, seconds(firstAnswer), lastCalled, seconds(lastCall)))
		}
		if len(rs) > 1 && instances[victim] && len(instances) == 1 && lastCall < stoppedAt {
			f.VictimMultiOrder++
		}
	}
	if f.Transactions > 0 {
		f.Mean = float64(f.Orders) / float64(f.Transactions)
	}

	// The killed instance's requests that never got an answer.
	hasRow := map[string]bool{}
	for _, row := range rows {
		hasRow[row.UserID] = true
	}
	for _, o := range orders {
		for _, a := range o.attempts {
			if a.instance == victim && a.call < killedAt && a.ret > stoppedAt && a.answer == ansNoAnswer {
				if hasRow[o.userID] {
					f.InFlightWithRow++
				} else {
					f.InFlightWithoutRow++
				}
			}
		}
	}

	// "Not at all" for the batches caught open. Of the rows one had
	// written, at most two a SKU of the load are stock rows (its
	// deduction, and a second after a plan made again under the lock);
	// the rest are orders (no keys in this load).
	loadSKUs := map[string]bool{}
	for _, o := range orders {
		loadSKUs[o.sku] = true
	}
	written := int64(0)
	for _, t := range caught {
		if !t.Wrote {
			continue
		}
		if stockRows := 2 * int64(len(loadSKUs)); t.RowsModified > stockRows {
			written += t.RowsModified - stockRows
		}
		if rs := byTx[t.ID]; t.RowsModified < 0 && len(rs) > 0 {
			bad = append(bad, fmt.Sprintf("transaction %s was open on the killed instance (last: %s), yet %d order rows of it exist", t.ID, t.Last, len(rs)))
		}
	}
	if int64(f.InFlightWithoutRow) < written {
		bad = append(bad, fmt.Sprintf("the killed instance's open transactions had written %d orders, but only %d of its unanswered requests have no row",
			written, f.InFlightWithoutRow))
	}
	r.res.Batches = f

	if len(bad) > 0 {
		slices.Sort(bad)
		r.fail("%d batches are not whole: %s", len(bad), sample(bad))
	}
	var open []string
	for _, t := range caught {
		switch {
		case t.RowsModified >= 0:
			open = append(open, fmt.Sprintf("%s (%d rows written)", t.ID, t.RowsModified))
		case t.ID != "":
			open = append(open, fmt.Sprintf("xid %s (last: %s)", t.ID, t.Last))
		default:
			open = append(open, "one before its first write")
		}
	}
	r.note("batches: %d transactions inserted %d orders (%d of more than one order, largest %d, mean %.2f); "+
		"the killed instance had committed %d multi-order batches before it was stopped",
		f.Transactions, f.Orders, f.MultiOrder, f.Largest, f.Mean, f.VictimMultiOrder)
	r.note("at the kill: %d transaction(s) of the killed instance open in the database: %s; %d of its unanswered requests had committed (answer lost), %d had not",
		len(caught), strings.Join(open, ", "), f.InFlightWithRow, f.InFlightWithoutRow)
	if f.MultiOrder == 0 {
		r.warn("no transaction held more than one order: the load formed no batch")
	} else if f.VictimMultiOrder == 0 {
		r.warn("the killed instance committed no batch of more than one order before the kill")
	}
	if !slices.ContainsFunc(caught, func(t openTx) bool { return t.Wrote }) {
		r.warn("the killed instance had no batch transaction open with writes done when it was killed")
	}
}
