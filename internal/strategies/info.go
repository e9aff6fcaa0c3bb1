package strategies

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

// Info is what the project says about one strategy. Every list of
// strategies (configuration, `stock strategies`, the demo, the report, the
// tests, the fault suite, the schedule explorer) takes it from All;
// their tests fail when a registered strategy is missing from them.
type Info struct {
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
}
