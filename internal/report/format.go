package report

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Strategy explains what a strategy does, for readers who know SQL but not
// this code base.
type Strategy struct {
	Name    string
	Safe    bool
	How     string
	Expect  string
	Unknown bool
}

// strategies describes the strategies the service has or is getting; an
// unknown name still gets a row, with a note.
var strategies = map[string]Strategy{
	"naive": {
		Name: "naive", Safe: false,
		How:    "Reads the stock, checks it in Go, waits NAIVE_RACE_WINDOW, then writes available − q. No lock: between the read and the write another order can take the same units.",
		Expect: "The control. It must oversell in the burst; that it does is the proof that the burst is hard enough to catch a broken strategy.",
	},
	"for-update": {
		Name: "for-update", Safe: true,
		How:    "BEGIN; SELECT … FOR UPDATE locks the row; Go checks; UPDATE; INSERT the order; COMMIT. Pessimistic: orders on one SKU queue on the row lock, which is held across two round trips and the commit.",
		Expect: "Safe. Slower than conditional because the lock is held longer.",
	},
	"version-cas": {
		Name: "version-cas", Safe: true,
		How:    "Reads (available, version), then UPDATE … WHERE version = v. A lost race re-reads and retries after a jittered backoff, up to CAS_MAX_ATTEMPTS and within ORDER_TIMEOUT, then answers 503 busy. Each instance runs at most CAS_MAX_IN_FLIGHT (2) attempts on a SKU at once.",
		Expect: "Safe. Optimistic: no lock while deciding, but on one hot row most attempts lose, so it burns round trips and can leave buyers with 503.",
	},
	"conditional": {
		Name: "conditional", Safe: true,
		How:    "UPDATE stock SET available = available − q WHERE sku = ? AND available >= q, then INSERT the order, in one transaction. The database checks and writes in one statement; the row is locked only for that statement and the commit.",
		Expect: "Safe, and the fewest round trips under the row lock: the one to beat.",
	},
	"batched": {
		Name: "batched", Safe: true,
		How:    "Each instance queues the concurrent orders of one SKU while the SKU's transaction is in flight; the queue (up to BATCH_MAX) is the next batch. One transaction per batch: UPDATE … SET available = available − total WHERE available >= total, then multi-row INSERTs of the orders and their idempotency keys. When the total does not fit: SELECT … FOR UPDATE, accept in arrival order while each order fits, the rest sold out.",
		Expect: "Safe: one conditional UPDATE (or the row lock) per batch. One transaction carries many orders, so on a hot row it should beat every strategy that commits once per order.",
	},
	"redis-lock": {
		Name: "redis-lock", Safe: true,
		How:    "A single-node Redis lock taken around the plain read-check-write: one script sets the lock and increments the SKU's fencing counter, a watchdog renews it, and the UPDATE refuses a token no higher than the last one it stored. Orders queue on the lock instead of on the row: a release hands the lock to the oldest waiting instance (pub/sub, no polling), and inside an instance it passes from one order to the next without a Redis call.",
		Expect: "Safe thanks to the fencing token. One transaction at a time reaches the hot row, so under a burst it can beat the strategies that queue on the row lock, at the price of a second system to run.",
	},
	"redlock": {
		Name: "redlock", Safe: true,
		How:    "Redlock over five independent Redis servers around the same read-check-write: instances queue at one gate server, then a majority must grant the lock (and take the fencing token) before the transaction runs; the token still guards the row.",
		Expect: "Safe thanks to the fencing token, and keeps selling with 2 of 5 servers down. One round to five servers per batch of orders, so close to redis-lock; Redlocks without the gate split their votes on one contended name and collapse.",
	},
	"etcd-lock": {
		Name: "etcd-lock", Safe: true,
		How:    "A lock on etcd v3 (a single member here; the same code runs on a three-member cluster) around the same read-check-write. Each instance keeps one session lease; each acquisition writes a key of its own, and the keys queue by etcd's global create revision. Each waiter watches only its predecessor, with a watch that starts when etcd registers it (a read then catches a deletion that came first), so a contended hand-over is not held up by etcd's 100 ms catch-up loop; inside an instance the lock passes first come, first served from one order to the next without queueing in etcd again. The fencing token is a fence base plus the revision at which the instance's batch of holders began, shifted left 16 bits, plus the holder's place in the batch (a local hand-over makes no etcd request), and the UPDATE refuses a token no higher than the last one it stored.",
		Expect: "Safe thanks to the fencing token. What consensus buys: on a cluster, a minority of members cannot lose or split the lock. What it costs: every acquisition from etcd is a raft write, committed to disk before it is granted, so expect it behind redis-lock under a burst.",
	},
	"zk-lock": {
		Name: "zk-lock", Safe: true,
		How:    "ZooKeeper's lock recipe around the same read-check-write: each acquisition creates an ephemeral sequential node with a protected name (a GUID prefix, so a create whose answer was lost is found again, not orphaned); the lowest number holds, and each waiter watches only its predecessor, so a release wakes one waiter, not the herd. The session's end frees the lock: SUSPENDED (connection lost) stops new writes at once, EXPIRED means the lock is lost. The fencing token comes from the zxid of the write that began the instance's batch of holders, shifted left 16 bits, plus the holder's place in the batch: inside an instance the lock passes first come, first served from one order to the next without a ZooKeeper request.",
		Expect: "Safe thanks to the fencing token. Like etcd, a quorum of servers decides, so a minority cannot lose or split the lock; every acquisition from ZooKeeper is a quorum write, so expect it behind redis-lock under a burst. LOCK_TTL is the session timeout: how long a crashed instance holds a SKU.",
	},
	"db-lock": {
		Name: "db-lock", Safe: true,
		How:    "A lock kept in a table of the stock's own database around the same read-check-write: one conditional statement takes the SKU's lock row if it is free or its lease has run out on the database's clock; a heartbeat renews the lease; release clears only the owner's own row; the row's counter is the fencing token, checked by the UPDATE. One waiter per instance polls the table every 1-5 ms; the others queue in the instance and get the lock handed over with the next token.",
		Expect: "Safe thanks to the fencing token. No second system to run, but every lock, hand-over, release and renewal is a statement on the same server as the orders, and waiters poll, so expect it behind redis-lock under a burst.",
	},
	"redis-reserve": {
		Name: "redis-reserve", Safe: true,
		How:    "The stock lives in Redis (a private one with appendonly yes and appendfsync always: the service refuses anything less). One Lua script per order checks the sale, the idempotency key and the stock, decrements it and appends the order to the SKU's Redis Stream, atomically; the 201 goes out once Redis has it on disk. A consumer in every instance reads the stream (XREADGROUP), writes the orders to the database in batches (the order id is the primary key, so a replay writes nothing; a restarted sale's orders are refused by its number) and acknowledges them after the commit.",
		Expect: "Safe: one atomic script per order on one counter. No database transaction per order and no row lock in the answer's path, so it should beat every database strategy by a wide margin; the database catches up behind it (the audit's pending and lag_seconds).",
	},
	"legacy-getset": {
		Name: "legacy-getset", Safe: false,
		How:    "The lock of the old articles around the same read-check-write, without fencing: SETNX key <expiry time>; when taken, GET it and, if that time has passed, GETSET a new one and compare; DEL to release. No owner, no renewal, no loss signal, no token; expiry judged by each instance's clock; waiters poll every 1–10 ms.",
		Expect: "A control. It holds while nothing goes wrong, so a burst may sell exactly; a paused holder, a clock ahead or a late release lets two orders hold the lock at once and oversell (make test shows each). Polling makes it slow under contention.",
	},
	"redis-watch": {
		Name: "redis-watch", Safe: true,
		How:    "The same Redis, keys, stream and consumer as redis-reserve, but each order is the seeds' optimistic transaction: WATCH the sale and the keys, read, check in Go, then MULTI / HINCRBY / XADD / EXEC. EXEC takes nothing when another order changed a watched key meanwhile, and the order tries again after a jittered backoff, up to CAS_MAX_ATTEMPTS, with at most CAS_MAX_IN_FLIGHT attempts per SKU in flight per instance.",
		Expect: "Safe: EXEC applies only what was checked against an unchanged sale. Three round trips per attempt, and on one hot SKU all but one of the attempts that run together lose: expect it well behind the script, which is what optimistic retries cost under a burst.",
	},
}

// DescribeStrategy returns what the report says about a strategy.
func DescribeStrategy(name string) Strategy {
	if s, ok := strategies[name]; ok {
		return s
	}
	return Strategy{Name: name, Safe: !IsControl(name), Unknown: true,
		How: "A strategy this report has no description of; see the service's docs/strategies.md."}
}

// fmtInt writes 1234567 as 1,234,567.
func fmtInt(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "−" + b.String()
	}
	return b.String()
}

// fmtRate writes a per-second figure: whole numbers with separators, one
// decimal under 100.
func fmtRate(v float64) string {
	switch {
	case v <= 0 || math.IsNaN(v):
		return "–"
	case v < 100:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return fmtInt(int64(math.Round(v)))
}

// fmtDur writes a latency readably: 0.8 ms, 12.3 ms, 172 ms, 1.04 s.
func fmtDur(d time.Duration) string {
	msf := float64(d) / float64(time.Millisecond)
	switch {
	case d <= 0:
		return "–"
	case msf < 10:
		return strconv.FormatFloat(msf, 'f', 1, 64) + " ms"
	case msf < 1000:
		return strconv.FormatFloat(msf, 'f', 0, 64) + " ms"
	}
	return strconv.FormatFloat(msf/1000, 'f', 2, 64) + " s"
}

// fmtRatio writes a ratio as 0.43× (two significant digits).
func fmtRatio(v float64) string {
	if v <= 0 {
		return "–"
	}
	if v >= 10 {
		return strconv.FormatFloat(v, 'f', 0, 64) + "×"
	}
	return strconv.FormatFloat(round(v, 2), 'f', -1, 64) + "×"
}

// fmtSeconds writes a window: 1.72 s, 15.0 s.
func fmtSeconds(d time.Duration) string {
	if d <= 0 {
		return "–"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 2, 64) + " s"
}

// StatusText is the verdict as a table shows it.
func StatusText(v Verdict) string {
	switch v.Status {
	case StatusOK:
		return "OK"
	case StatusFail:
		return "FAIL"
	case StatusError:
		return "ERROR"
	case StatusControlOversold:
		return "oversold (control)"
	case StatusControlHeld:
		return "no oversell (control)"
	}
	return string(v.Status)
}

func conservationText(v Verdict) string {
	if v.Status == StatusError {
		return "–"
	}
	if v.Conserved && v.Unconfirmed == 0 {
		return "OK"
	}
	return "NO"
}

func plural(n int64, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%s %s", fmtInt(n), one)
	}
	return fmt.Sprintf("%s %s", fmtInt(n), many)
}
