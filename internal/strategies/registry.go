package strategies

import (
	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/sqlrow"
)

// Names of the strategies, as STRATEGY spells them. A strategy package
// names itself (sqlrow, batched, reservation); the lock strategies are one
// package (internal/locked) over several backends, named here.
const (
	NameNaive        = sqlrow.NameNaive
	NameForUpdate    = sqlrow.NameForUpdate
	NameVersionCAS   = sqlrow.NameVersionCAS
	NameConditional  = sqlrow.NameConditional
	NameBatched      = batched.Name
	NameRedisLock    = "redis-lock"
	NameRedlock      = "redlock"
	NameEtcdLock     = "etcd-lock"
	NameZKLock       = "zk-lock"
	NameDBLock       = "db-lock" // its lock in a table of the stock's own database
	NameRedisReserve = reservation.NameRedisReserve
	NameRedisWatch   = reservation.NameRedisWatch
	// NameLegacyGetset is the SETNX + GETSET lock of older Redis articles
	// around the same read-check-write, without fencing: a control that
	// must be seen to fail, like naive.
	NameLegacyGetset = "legacy-getset"
)

const lockedInvariant = "under the lock, UPDATE … WHERE fence < token AND version = (the version read): the lock orders the writers, the fence refuses a holder whose lock has passed on, the version check validates what was read"

const lockedBreaks = "without the version check, with one unit left: A (token 41) reads 1 and stalls past its TTL; B (token 42) reads 1; A writes (fence 40 < 41) and commits; B writes (41 < 42) and commits: −1; without the fence, A's late write lands after B's"

// registry is every strategy, in the order `stock strategies` lists them:
// what it is (Info) and how it is built.
var registry = []Entry{
	rowEntry(Info{
		Name: NameNaive, Class: ClassControl, Family: FamilySQL,
		Invariant: "none: it reads, checks in Go and writes available − q with no lock and no condition",
		Breaks:    "two buyers read the last unit, both pass the check, both write: −1",
		How:       "Reads the stock, checks it in Go, waits NAIVE_RACE_WINDOW, then writes available − q. No lock: between the read and the write another order can take the same units.",
		Expect:    "The control. It must oversell in the burst; that it does is the proof that the burst is hard enough to catch a broken strategy.",
	}, append([]string{"NAIVE_RACE_WINDOW"}, sqlSettings...), true, func(cfg Config) inventory.Strategic {
		return sqlrow.NewNaive(sqlrow.WithRaceWindow(cfg.NaiveRaceWindow))
	}, func() inventory.Strategic { return sqlrow.NewNaive() }),
	rowEntry(Info{
		Name: NameForUpdate, Class: ClassSafe, Family: FamilySQL,
		Invariant: "SELECT … FOR UPDATE holds the row from the read to the commit, so the write deducts from the stock that was checked",
		Breaks:    "without FOR UPDATE, two buyers read the last unit in their transactions, both pass the check, both write: −1",
		How:       "BEGIN; SELECT … FOR UPDATE locks the row; Go checks; UPDATE; INSERT the order; COMMIT. Pessimistic: orders on one SKU queue on the row lock, which is held across two round trips and the commit.",
		Expect:    "Safe. Slower than conditional because the lock is held longer.",
	}, sqlSettings, true, func(Config) inventory.Strategic { return sqlrow.NewForUpdate() },
		func() inventory.Strategic { return sqlrow.NewForUpdate() }),
	rowEntry(Info{
		Name: NameVersionCAS, Class: ClassSafe, Family: FamilySQL,
		Invariant: "UPDATE … WHERE version = (the version read): a write applies only to the row it read, and a lost race reads again",
		Breaks:    "without the version condition, two buyers read (1, v7), both write available − 1: −1",
		How:       "Reads (available, version), then UPDATE … WHERE version = v. A lost race re-reads and retries after a jittered backoff, up to CAS_MAX_ATTEMPTS and within ORDER_TIMEOUT, then answers 503 busy. Each instance runs at most CAS_MAX_IN_FLIGHT (2) attempts on a SKU at once.",
		Expect:    "Safe. Optimistic: no lock while deciding, but on one hot row most attempts lose, so it burns round trips and can leave buyers with 503.",
	}, sqlSettings, false, func(cfg Config) inventory.Strategic {
		// version-cas bounds its attempts itself (CAS_MAX_IN_FLIGHT), not
		// with the row gate.
		return sqlrow.NewVersionCAS(sqlrow.WithMaxAttempts(cfg.CASMaxAttempts), sqlrow.WithMaxInFlight(cfg.CASMaxInFlight))
	}, func() inventory.Strategic { return sqlrow.NewVersionCAS() }),
	rowEntry(Info{
		Name: NameConditional, Class: ClassSafe, Family: FamilySQL,
		Invariant: "UPDATE … SET available = available − q WHERE available >= q: the database checks and deducts in one statement",
		Breaks:    "without the WHERE available >= q, two buyers of the last unit both decrement: −1",
		How:       "UPDATE stock SET available = available − q WHERE sku = ? AND available >= q, then INSERT the order, in one transaction. The database checks and writes in one statement; the row is locked only for that statement and the commit.",
		Expect:    "Safe, and the fewest round trips under the row lock: the one to beat.",
	}, sqlSettings, true, func(Config) inventory.Strategic { return sqlrow.NewConditional() },
		func() inventory.Strategic { return sqlrow.NewConditional() }),
	batchedEntry(Info{
		Name: NameBatched, Class: ClassSafe, Family: FamilyBatched,
		Invariant: "each SKU's total in a batch is deducted by one conditional UPDATE, or, when it does not fit, planned from the row read under the batch's lock in arrival order while each order fits; a batch takes its SKUs' rows in SKU order",
		Breaks:    "deducting the orders that fit from a count read without the row lock: another instance's batch commits between the read and the write, and both take the last units; taking two SKUs' rows in arrival order: two instances' batches of a and b, one a-then-b and one b-then-a, deadlock",
		How:       "Each instance queues its concurrent orders in BATCH_LANES lanes (by default 1 on PostgreSQL, 2 on MariaDB; a SKU is always in one lane) while the lane's transaction is in flight; the queue (up to BATCH_MAX) is the next batch, whatever its SKUs. One transaction per batch: one statement locks the rows in SKU order, skipping rows other transactions hold (FOR UPDATE SKIP LOCKED), and deducts each SKU's total where available >= total; then multi-row INSERTs of the orders and their idempotency keys. A SKU whose total does not fit: its orders are accepted in arrival order from the row read under the lock while each fits, the rest sold out. A held row's orders move to a queue of that SKU alone that waits for it, so one held row stalls only its SKU.",
		Expect:    "Safe: one conditional UPDATE (or the row lock) per batch. One transaction carries many orders, so on a hot row it should beat every strategy that commits once per order.",
	}),
	redisLockEntry(Info{
		Name: NameRedisLock, Lock: LockRedis, Class: ClassSafe, Family: FamilyLock, Needs: []Server{ServerRedis},
		Invariant: lockedInvariant,
		Breaks:    lockedBreaks,
		How:       "A single-node Redis lock taken around the plain read-check-write: one script sets the lock and increments the SKU's fencing counter, a watchdog renews it, and the UPDATE refuses a token no higher than the last one it stored. Orders queue on the lock instead of on the row: a release hands the lock to the oldest waiting instance (pub/sub, no polling), and inside an instance it passes from one order to the next without a Redis call.",
		Expect:    "Safe thanks to the fencing token. One transaction at a time reaches the hot row, so under a burst it can beat the strategies that queue on the row lock, at the price of a second system to run.",
	}, false),
	redisLockEntry(Info{
		Name: NameRedlock, Lock: LockRedlock, Class: ClassSafe, Family: FamilyLock, Needs: []Server{ServerRedisQuorum},
		Invariant: lockedInvariant + "; the token keeps growing while a majority of the servers keeps its data",
		Breaks:    lockedBreaks,
		How:       "Redlock over five independent Redis servers around the same read-check-write: instances queue at one gate server, then a majority must grant the lock (and take the fencing token) before the transaction runs; the token still guards the row.",
		Expect:    "Safe thanks to the fencing token, and keeps selling with 2 of 5 servers down. One round to five servers per batch of orders, so close to redis-lock; Redlocks without the gate split their votes on one contended name and collapse.",
	}, true),
	lockEntry(Info{
		Name: NameEtcdLock, Lock: LockEtcd, Class: ClassSafe, Family: FamilyLock, Needs: []Server{ServerEtcd},
		Invariant: lockedInvariant + "; tokens grow in hold order from the revision of the request that began each batch of holders",
		Breaks:    lockedBreaks,
		How:       "A lock on etcd v3 (a single member here; the same code runs on a three-member cluster) around the same read-check-write. Each instance keeps one session lease; each acquisition writes a key of its own, and the keys queue by etcd's global create revision. Each waiter watches only its predecessor, with a watch that starts when etcd registers it (a read then catches a deletion that came first), so a contended hand-over is not held up by etcd's 100 ms catch-up loop; inside an instance the lock passes first come, first served from one order to the next without queueing in etcd again. The fencing token is a fence base plus the revision at which the instance's batch of holders began, shifted left 16 bits, plus the holder's place in the batch (a local hand-over makes no etcd request), and the UPDATE refuses a token no higher than the last one it stored.",
		Expect:    "Safe thanks to the fencing token. What consensus buys: on a cluster, a minority of members cannot lose or split the lock. What it costs: every acquisition from etcd is a raft write, committed to disk before it is granted, so expect it behind redis-lock under a burst.",
	}, etcdBackend, checkEtcdTTL),
	lockEntry(Info{
		Name: NameZKLock, Lock: LockZooKeeper, Class: ClassSafe, Family: FamilyLock, Needs: []Server{ServerZooKeeper},
		Invariant: lockedInvariant + "; a lost session ends the lease at once, and tokens grow from the zxid of each batch's token write",
		Breaks:    lockedBreaks,
		How:       "ZooKeeper's lock recipe around the same read-check-write: each acquisition creates an ephemeral sequential node with a protected name (a GUID prefix, so a create whose answer was lost is found again, not orphaned); the lowest number holds, and each waiter watches only its predecessor, so a release wakes one waiter, not the herd. The session's end frees the lock: SUSPENDED (connection lost) stops new writes at once, EXPIRED means the lock is lost. The fencing token comes from the zxid of the write that began the instance's batch of holders, shifted left 16 bits, plus the holder's place in the batch: inside an instance the lock passes first come, first served from one order to the next without a ZooKeeper request.",
		Expect:    "Safe thanks to the fencing token. Like etcd, a quorum of servers decides, so a minority cannot lose or split the lock; every acquisition from ZooKeeper is a quorum write, so expect it behind redis-lock under a burst. LOCK_TTL is the session timeout: how long a crashed instance holds a SKU.",
	}, zkBackend, nil),
	lockEntry(Info{
		Name: NameDBLock, Lock: LockTable, Class: ClassSafe, Family: FamilyLock,
		Invariant: lockedInvariant + "; the lease is judged by the database's clock and the lock row's counter is the token",
		Breaks:    lockedBreaks,
		How:       "A lock kept in a table of the stock's own database around the same read-check-write: one conditional statement takes the SKU's lock row if it is free or its lease has run out on the database's clock; a heartbeat renews the lease; release clears only the owner's own row; the row's counter is the fencing token, checked by the UPDATE. One waiter per instance polls the table every 1-5 ms; the others queue in the instance and get the lock handed over with the next token.",
		Expect:    "Safe thanks to the fencing token. No second system to run, but every lock, hand-over, release and renewal is a statement on the same server as the orders, and waiters poll, so expect it behind redis-lock under a burst.",
	}, dbBackend, nil),
	reserveEntry(Info{
		Name: NameRedisReserve, Class: ClassSafe, Family: FamilyReserved, Needs: []Server{ServerDurableRedis},
		Invariant: "one Lua script checks the sale, the idempotency key and the stock, decrements the counter and appends the order to the stream, atomically on one counter loaded once per sale, and the 201 waits for the fsync",
		Breaks:    "checking in Go and decrementing in a second command: two buyers read 1, both decrement; or answering before the fsync: a Redis restart forgets sold units and sells them again",
		How:       "The stock lives in Redis (a private one with appendonly yes and appendfsync always: the service refuses anything less). One Lua script per order checks the sale, the idempotency key and the stock, decrements it and appends the order to the SKU's Redis Stream, atomically; the 201 goes out once Redis has it on disk. A consumer in every instance reads the stream (XREADGROUP), writes the orders to the database in batches (the order id is the primary key, so a replay writes nothing; a restarted sale's orders are refused by its number) and acknowledges them after the commit.",
		Expect:    "Safe: one atomic script per order on one counter. No database transaction per order and no row lock in the answer's path, so it should beat every database strategy by a wide margin; the database catches up behind it (the audit's pending and lag_seconds).",
	}, false),
	reserveEntry(Info{
		Name: NameRedisWatch, Class: ClassSafe, Family: FamilyReserved, Needs: []Server{ServerDurableRedis},
		Invariant: "EXEC applies the decrement and the stream entry only if no watched key (the sale, the idempotency key) changed since the read that decided it",
		Breaks:    "without the WATCH, two orders read the last unit and both MULTI/EXEC their decrement: −1",
		How:       "The same Redis, keys, stream and consumer as redis-reserve, but each order is Redis's textbook optimistic transaction: WATCH the sale and the keys, read, check in Go, then MULTI / HINCRBY / XADD / EXEC. EXEC takes nothing when another order changed a watched key meanwhile, and the order tries again after a jittered backoff, up to CAS_MAX_ATTEMPTS, with at most CAS_MAX_IN_FLIGHT attempts per SKU in flight per instance.",
		Expect:    "Safe: EXEC applies only what was checked against an unchanged sale. Three round trips per attempt, and on one hot SKU all but one of the attempts that run together lose: expect it well behind the script, which is what optimistic retries cost under a burst.",
	}, true),
	legacyEntry(Info{
		Name: NameLegacyGetset, Lock: LockGetset, Class: ClassControl, Family: FamilyLock, Needs: []Server{ServerRedis},
		Invariant: "none that holds: SETNX + GETSET with no owner, no renewal, no loss signal and no token, expiry judged by each instance's clock",
		Breaks:    "a holder paused past its expiry wakes after another took the lock and writes what it read before: two holders, −1; a late release deletes the successor's lock",
		How:       "The lock of the old articles around the same read-check-write, without fencing: SETNX key <expiry time>; when taken, GET it and, if that time has passed, GETSET a new one and compare; DEL to release. No owner, no renewal, no loss signal, no token; expiry judged by each instance's clock; waiters poll every 1–10 ms.",
		Expect:    "A control. It holds while nothing goes wrong, so a burst may sell exactly; a paused holder, a clock ahead or a late release lets two orders hold the lock at once and oversell (make test shows each). Polling makes it slow under contention.",
	}),
}
