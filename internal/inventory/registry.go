package inventory

import "slices"

// Class says whether a strategy is safe or a control that oversells by
// design (kept to show what the safe ones prevent).
type Class string

const (
	ClassSafe    Class = "safe"
	ClassControl Class = "control"
)

// Family groups the strategies that deduct the same way.
type Family string

const (
	// FamilySQL: one order, one transaction, guarded by the SQL itself.
	FamilySQL Family = "SQL row"
	// FamilyBatched: the concurrent orders of a SKU in one transaction.
	FamilyBatched Family = "SQL row, group commit"
	// FamilyLock: read, check and write under a distributed lock.
	FamilyLock Family = "lock"
	// FamilyReserved: the stock counted in Redis, the orders streamed to
	// the database.
	FamilyReserved Family = "Redis counter and stream"
)

// Server is a server a strategy needs besides its database.
type Server string

const (
	ServerRedis        Server = "Redis"                                                   // the first of REDIS_ADDRS
	ServerRedisQuorum  Server = "an odd number (at least 3) of independent Redis servers" // all of REDIS_ADDRS
	ServerDurableRedis Server = "a durable Redis (appendonly yes, appendfsync always) or Redis Cluster"
	ServerEtcd         Server = "etcd"
	ServerZooKeeper    Server = "ZooKeeper"
)

// LockKind is where a lock strategy's lock lives, for the tools that watch
// or break it (the fault suite reads its holder, kills its servers); "" for
// a strategy that takes no lock.
type LockKind string

const (
	LockRedis     LockKind = "redis"     // a key on one Redis server
	LockRedlock   LockKind = "redlock"   // keys on a majority of Redis servers
	LockEtcd      LockKind = "etcd"      // a key per holder, under a session lease
	LockZooKeeper LockKind = "zookeeper" // an ephemeral sequential node per holder
	LockTable     LockKind = "table"     // a row of a table in the stock's own database
	LockGetset    LockKind = "getset"    // the SETNX + GETSET control's key on one Redis
)

// StrategyInfo is what the project says about one strategy. Every list of
// strategies (configuration, `stock strategies`, the demo, the report, the
// tests, the fault suite, the schedule explorer) takes it from Strategies;
// their tests fail when a registered strategy is missing from them.
type StrategyInfo struct {
	Name   string
	Class  Class
	Family Family
	// Needs are the servers it needs beyond the database.
	Needs []Server
	// Lock is where its lock lives ("" for a strategy without one).
	Lock LockKind
	// Invariant is what makes its write safe, in one sentence; for a
	// control, why it is not.
	Invariant string
	// Breaks is the schedule that oversells if the guard of the invariant
	// were missing; for a control, the schedule that does.
	Breaks string
	// How says how it deducts, for a reader who knows SQL but not this
	// code base.
	How string
	// Expect says what the comparison should show of it.
	Expect string
	// New builds a strategy that only deducts (a Deduct through the
	// service's transaction) with its default options. The service, the
	// conformance test, the schedule explorer and the fault suite build it
	// from here, so that adding such a strategy is its file and its entry
	// here. nil for a strategy that needs wiring (servers, a store).
	New func() Strategy
}

// Safe reports whether the strategy is not a control.
func (s StrategyInfo) Safe() bool { return s.Class == ClassSafe }

// NeedsServer reports whether the strategy needs srv.
func (s StrategyInfo) NeedsServer(srv Server) bool { return slices.Contains(s.Needs, srv) }

// Strategies returns every registered strategy, in the order `stock
// strategies` lists them.
func Strategies() []StrategyInfo { return slices.Clone(registry) }

// LookupStrategy returns the registered strategy named name.
func LookupStrategy(name string) (StrategyInfo, bool) {
	i := slices.IndexFunc(registry, func(s StrategyInfo) bool { return s.Name == name })
	if i < 0 {
		return StrategyInfo{}, false
	}
	return registry[i], true
}

// StrategyNames lists every value STRATEGY accepts.
func StrategyNames() []string { return namesWhere(func(StrategyInfo) bool { return true }) }

// IsControl reports whether name is a registered control.
func IsControl(name string) bool {
	s, ok := LookupStrategy(name)
	return ok && s.Class == ClassControl
}

func namesWhere(keep func(StrategyInfo) bool) []string {
	var names []string
	for _, s := range registry {
		if keep(s) {
			names = append(names, s.Name)
		}
	}
	return names
}

// The lists by family that the wiring and the tests use.
var (
	// SQLStrategyNames: one order per transaction, the control included.
	SQLStrategyNames = namesWhere(func(s StrategyInfo) bool { return s.Family == FamilySQL })
	// LockStrategyNames: the safe strategies that deduct under a
	// distributed lock with a fencing token (legacy-getset, a lock without
	// one, is not among them).
	LockStrategyNames = namesWhere(func(s StrategyInfo) bool { return s.Family == FamilyLock && s.Safe() })
	// ReservedStrategyNames: the stock counted in Redis.
	ReservedStrategyNames = namesWhere(func(s StrategyInfo) bool { return s.Family == FamilyReserved })
)

const lockedInvariant = "under the lock, UPDATE … WHERE fence < token AND version = (the version read): the lock orders the writers, the fence refuses a holder whose lock has passed on, the version check validates what was read"

const lockedBreaks = "without the version check, with one unit left: A (token 41) reads 1 and stalls past its TTL; B (token 42) reads 1; A writes (fence 40 < 41) and commits; B writes (41 < 42) and commits: −1; without the fence, A's late write lands after B's"

// registry is every strategy, in the order `stock strategies` lists them.
var registry = []StrategyInfo{
	{
		Name: NameNaive, Class: ClassControl, Family: FamilySQL,
		Invariant: "none: it reads, checks in Go and writes available − q with no lock and no condition",
		Breaks:    "two buyers read the last unit, both pass the check, both write: −1",
		How:       "Reads the stock, checks it in Go, waits NAIVE_RACE_WINDOW, then writes available − q. No lock: between the read and the write another order can take the same units.",
		Expect:    "The control. It must oversell in the burst; that it does is the proof that the burst is hard enough to catch a broken strategy.",
		New:       func() Strategy { return NewNaive().Strategy() },
	},
	{
		Name: NameForUpdate, Class: ClassSafe, Family: FamilySQL,
		Invariant: "SELECT … FOR UPDATE holds the row from the read to the commit, so the write deducts from the stock that was checked",
		Breaks:    "without FOR UPDATE, two buyers read the last unit in their transactions, both pass the check, both write: −1",
		How:       "BEGIN; SELECT … FOR UPDATE locks the row; Go checks; UPDATE; INSERT the order; COMMIT. Pessimistic: orders on one SKU queue on the row lock, which is held across two round trips and the commit.",
		Expect:    "Safe. Slower than conditional because the lock is held longer.",
		New:       func() Strategy { return NewForUpdate().Strategy() },
	},
	{
		Name: NameVersionCAS, Class: ClassSafe, Family: FamilySQL,
		Invariant: "UPDATE … WHERE version = (the version read): a write applies only to the row it read, and a lost race reads again",
		Breaks:    "without the version condition, two buyers read (1, v7), both write available − 1: −1",
		How:       "Reads (available, version), then UPDATE … WHERE version = v. A lost race re-reads and retries after a jittered backoff, up to CAS_MAX_ATTEMPTS and within ORDER_TIMEOUT, then answers 503 busy. Each instance runs at most CAS_MAX_IN_FLIGHT (2) attempts on a SKU at once.",
		Expect:    "Safe. Optimistic: no lock while deciding, but on one hot row most attempts lose, so it burns round trips and can leave buyers with 503.",
		New:       func() Strategy { return NewVersionCAS().Strategy() },
	},
	{
		Name: NameConditional, Class: ClassSafe, Family: FamilySQL,
		Invariant: "UPDATE … SET available = available − q WHERE available >= q: the database checks and deducts in one statement",
		Breaks:    "without the WHERE available >= q, two buyers of the last unit both decrement: −1",
		How:       "UPDATE stock SET available = available − q WHERE sku = ? AND available >= q, then INSERT the order, in one transaction. The database checks and writes in one statement; the row is locked only for that statement and the commit.",
		Expect:    "Safe, and the fewest round trips under the row lock: the one to beat.",
		New:       func() Strategy { return NewConditional().Strategy() },
	},
	{
		Name: NameBatched, Class: ClassSafe, Family: FamilyBatched,
		Invariant: "a batch's total is deducted by one conditional UPDATE, or, when it does not fit, under the row lock in arrival order while each order fits",
		Breaks:    "deducting the orders that fit from a count read without the row lock: another instance's batch commits between the read and the write, and both take the last units",
		How:       "Each instance queues the concurrent orders of one SKU while the SKU's transaction is in flight; the queue (up to BATCH_MAX) is the next batch. One transaction per batch: UPDATE … SET available = available − total WHERE available >= total, then multi-row INSERTs of the orders and their idempotency keys. When the total does not fit: SELECT … FOR UPDATE, accept in arrival order while each order fits, the rest sold out.",
		Expect:    "Safe: one conditional UPDATE (or the row lock) per batch. One transaction carries many orders, so on a hot row it should beat every strategy that commits once per order.",
	},
	{
		Name: NameRedisLock, Lock: LockRedis, Class: ClassSafe, Family: FamilyLock, Needs: []Server{ServerRedis},
		Invariant: lockedInvariant,
		Breaks:    lockedBreaks,
		How:       "A single-node Redis lock taken around the plain read-check-write: one script sets the lock and increments the SKU's fencing counter, a watchdog renews it, and the UPDATE refuses a token no higher than the last one it stored. Orders queue on the lock instead of on the row: a release hands the lock to the oldest waiting instance (pub/sub, no polling), and inside an instance it passes from one order to the next without a Redis call.",
		Expect:    "Safe thanks to the fencing token. One transaction at a time reaches the hot row, so under a burst it can beat the strategies that queue on the row lock, at the price of a second system to run.",
	},
	{
		Name: NameRedlock, Lock: LockRedlock, Class: ClassSafe, Family: FamilyLock, Needs: []Server{ServerRedisQuorum},
		Invariant: lockedInvariant + "; the token keeps growing while a majority of the servers keeps its data",
		Breaks:    lockedBreaks,
		How:       "Redlock over five independent Redis servers around the same read-check-write: instances queue at one gate server, then a majority must grant the lock (and take the fencing token) before the transaction runs; the token still guards the row.",
		Expect:    "Safe thanks to the fencing token, and keeps selling with 2 of 5 servers down. One round to five servers per batch of orders, so close to redis-lock; Redlocks without the gate split their votes on one contended name and collapse.",
	},
	{
		Name: NameEtcdLock, Lock: LockEtcd, Class: ClassSafe, Family: FamilyLock, Needs: []Server{ServerEtcd},
		Invariant: lockedInvariant + "; tokens grow in hold order from the revision of the request that began each batch of holders",
		Breaks:    lockedBreaks,
		How:       "A lock on etcd v3 (a single member here; the same code runs on a three-member cluster) around the same read-check-write. Each instance keeps one session lease; each acquisition writes a key of its own, and the keys queue by etcd's global create revision. Each waiter watches only its predecessor, with a watch that starts when etcd registers it (a read then catches a deletion that came first), so a contended hand-over is not held up by etcd's 100 ms catch-up loop; inside an instance the lock passes first come, first served from one order to the next without queueing in etcd again. The fencing token is a fence base plus the revision at which the instance's batch of holders began, shifted left 16 bits, plus the holder's place in the batch (a local hand-over makes no etcd request), and the UPDATE refuses a token no higher than the last one it stored.",
		Expect:    "Safe thanks to the fencing token. What consensus buys: on a cluster, a minority of members cannot lose or split the lock. What it costs: every acquisition from etcd is a raft write, committed to disk before it is granted, so expect it behind redis-lock under a burst.",
	},
	{
		Name: NameZKLock, Lock: LockZooKeeper, Class: ClassSafe, Family: FamilyLock, Needs: []Server{ServerZooKeeper},
		Invariant: lockedInvariant + "; a lost session ends the lease at once, and tokens grow from the zxid of each batch's token write",
		Breaks:    lockedBreaks,
		How:       "ZooKeeper's lock recipe around the same read-check-write: each acquisition creates an ephemeral sequential node with a protected name (a GUID prefix, so a create whose answer was lost is found again, not orphaned); the lowest number holds, and each waiter watches only its predecessor, so a release wakes one waiter, not the herd. The session's end frees the lock: SUSPENDED (connection lost) stops new writes at once, EXPIRED means the lock is lost. The fencing token comes from the zxid of the write that began the instance's batch of holders, shifted left 16 bits, plus the holder's place in the batch: inside an instance the lock passes first come, first served from one order to the next without a ZooKeeper request.",
		Expect:    "Safe thanks to the fencing token. Like etcd, a quorum of servers decides, so a minority cannot lose or split the lock; every acquisition from ZooKeeper is a quorum write, so expect it behind redis-lock under a burst. LOCK_TTL is the session timeout: how long a crashed instance holds a SKU.",
	},
	{
		Name: NameDBLock, Lock: LockTable, Class: ClassSafe, Family: FamilyLock,
		Invariant: lockedInvariant + "; the lease is judged by the database's clock and the lock row's counter is the token",
		Breaks:    lockedBreaks,
		How:       "A lock kept in a table of the stock's own database around the same read-check-write: one conditional statement takes the SKU's lock row if it is free or its lease has run out on the database's clock; a heartbeat renews the lease; release clears only the owner's own row; the row's counter is the fencing token, checked by the UPDATE. One waiter per instance polls the table every 1-5 ms; the others queue in the instance and get the lock handed over with the next token.",
		Expect:    "Safe thanks to the fencing token. No second system to run, but every lock, hand-over, release and renewal is a statement on the same server as the orders, and waiters poll, so expect it behind redis-lock under a burst.",
	},
	{
		Name: NameRedisReserve, Class: ClassSafe, Family: FamilyReserved, Needs: []Server{ServerDurableRedis},
		Invariant: "one Lua script checks the sale, the idempotency key and the stock, decrements the counter and appends the order to the stream, atomically on one counter loaded once per sale, and the 201 waits for the fsync",
		Breaks:    "checking in Go and decrementing in a second command: two buyers read 1, both decrement; or answering before the fsync: a Redis restart forgets sold units and sells them again",
		How:       "The stock lives in Redis (a private one with appendonly yes and appendfsync always: the service refuses anything less). One Lua script per order checks the sale, the idempotency key and the stock, decrements it and appends the order to the SKU's Redis Stream, atomically; the 201 goes out once Redis has it on disk. A consumer in every instance reads the stream (XREADGROUP), writes the orders to the database in batches (the order id is the primary key, so a replay writes nothing; a restarted sale's orders are refused by its number) and acknowledges them after the commit.",
		Expect:    "Safe: one atomic script per order on one counter. No database transaction per order and no row lock in the answer's path, so it should beat every database strategy by a wide margin; the database catches up behind it (the audit's pending and lag_seconds).",
	},
	{
		Name: NameRedisWatch, Class: ClassSafe, Family: FamilyReserved, Needs: []Server{ServerDurableRedis},
		Invariant: "EXEC applies the decrement and the stream entry only if no watched key (the sale, the idempotency key) changed since the read that decided it",
		Breaks:    "without the WATCH, two orders read the last unit and both MULTI/EXEC their decrement: −1",
		How:       "The same Redis, keys, stream and consumer as redis-reserve, but each order is Redis's textbook optimistic transaction: WATCH the sale and the keys, read, check in Go, then MULTI / HINCRBY / XADD / EXEC. EXEC takes nothing when another order changed a watched key meanwhile, and the order tries again after a jittered backoff, up to CAS_MAX_ATTEMPTS, with at most CAS_MAX_IN_FLIGHT attempts per SKU in flight per instance.",
		Expect:    "Safe: EXEC applies only what was checked against an unchanged sale. Three round trips per attempt, and on one hot SKU all but one of the attempts that run together lose: expect it well behind the script, which is what optimistic retries cost under a burst.",
	},
	{
		Name: NameLegacyGetset, Lock: LockGetset, Class: ClassControl, Family: FamilyLock, Needs: []Server{ServerRedis},
		Invariant: "none that holds: SETNX + GETSET with no owner, no renewal, no loss signal and no token, expiry judged by each instance's clock",
		Breaks:    "a holder paused past its expiry wakes after another took the lock and writes what it read before: two holders, −1; a late release deletes the successor's lock",
		How:       "The lock of the old articles around the same read-check-write, without fencing: SETNX key <expiry time>; when taken, GET it and, if that time has passed, GETSET a new one and compare; DEL to release. No owner, no renewal, no loss signal, no token; expiry judged by each instance's clock; waiters poll every 1–10 ms.",
		Expect:    "A control. It holds while nothing goes wrong, so a burst may sell exactly; a paused holder, a clock ahead or a late release lets two orders hold the lock at once and oversell (make test shows each). Polling makes it slow under contention.",
	},
}
