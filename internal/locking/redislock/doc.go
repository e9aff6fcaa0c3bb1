// Package redislock offers distributed locks on Redis: Locker over one server
// and Redlock over N independent servers (N odd, at least 3). Both hand out
// a Lease with a fencing token, renew it with a watchdog while it is held,
// cancel the holder's context when the lock is lost, let waiters be woken by
// pub/sub instead of retrying on a timer, queue the goroutines of one
// process locally (FIFO), and re-enter a lock for the holder's own context.
// The package knows nothing of what the lock protects.
//
// # A lock is a lease, not a mutex
//
// A process can pause (GC, swap, a stopped VM) for longer than the lock's
// TTL and resume believing it holds the lock while someone else does. No
// lock service can prevent that; the protected resource can detect it if
// every write carries the holder's fencing token and the resource refuses a
// token lower than one it has already seen (for example
// "UPDATE ... WHERE fence < $token", then set fence = $token). Lease.Token
// exists for that. Lease.Context is cancelled as soon as the holder can
// know the lock is gone (a renewal fails, or the validity ends unrenewed),
// which stops most stale work early, but only the token makes it safe.
//
// Fencing orders writes; the version check validates the read. The fence
// keeps an old holder's write from landing after a newer holder's, but it
// says nothing about what the writer read: with one unit left, A reads 1
// and stalls past its TTL, B takes the lock and reads 1, A's write lands
// (its token beats the stored fence) and so does B's (its token beats A's):
// the stock is −1. The protected write must also require that the resource
// is still as the holder read it — in this project, the row's version:
// "… WHERE fence < $token AND version = $read" — and a holder whose lock is
// still valid reads again and retries. Then a write applies only if no
// other write reached the resource since the read and no newer holder has
// written, so every write saw the state it changes
// (internal/locked.Locked).
//
// # Tokens: a counter and a place
//
// A fencing token has two parts: counter<<16 + place (the two-part tokens
// of internal/locking, with the counter as the epoch). The counter K:fence
// grows by one with every acquisition from Redis; the
// place is 0 for the holder that took the counter and 1, 2, … for the
// goroutines of its process it hands the lock on to (see Hand-overs
// inside a process). The sections below argue that each acquisition from
// Redis takes a counter above every earlier holder's, which puts its token
// above every place of every earlier chain.
//
// # Fencing on one server
//
// The acquire script sets the lock (SET NX PX) and increments the key's
// counter (INCR K:fence) in one script, and hand-overs to a queued waiter
// do the same, so each new holder from Redis gets the next counter:
// strictly growing, as long as the server keeps its data (Reset keeps the
// counter; run Redis with persistence and maxmemory-policy noeviction, so
// neither a restart nor an eviction loses it).
//
// # Fencing across Redlock nodes
//
// Each node keeps a counter K:fence next to the lock key K. To acquire, a
// contender runs on every node a script that sets K (SET NX PX) and, in the
// same script, reads K:fence. With K set on a majority M, it takes
// token = max(counters read on M) + 1 and writes it back with a
// set-if-greater script that only writes where K is still its own; the lock
// is reported held only when a majority W acknowledged the token, and only
// if its validity (ttl - elapsed - drift) has not run out.
//
// (Here, as below, "token" is the counter part; the place adds nothing.)
//
// The write-back usually goes with the acquisition instead: the contender
// that holds the gate (see Waiting) learns the gate node's counter c there
// and proposes c+1 with its round. The acquire script then, after its read
// and in the same script as the SET, raises the counter to c+1
// (set-if-greater) and replies with the value it read. If every value read
// on the majority M is below c+1, the token is c+1 and W = M took it with
// the SET; otherwise the proposal is dropped and the token is fixed as
// above, by max+1 and a second round. Either way the token exceeds
// every value read on a majority, and a majority holds it (or more) before
// the lock is reported held, which is all the argument below uses. A
// dropped proposal, or a round that failed after raising some counters,
// only leaves a counter higher than needed: a gap in the tokens.
//
// Why the tokens of successive holders H1, H2 grow: W1 (where H1 wrote t1)
// and M2 (where H2 set K and read the counter) are both majorities of the
// same N nodes, so they share a node n. On n, H1's key was present when H1
// wrote t1 and stayed there until H1 reported the lock held (release comes
// later; expiry later still, which is what the validity check with the
// drift allowance guarantees). H2 could set K on n only once H1's key was
// gone, so H2's read on n came after H1's write: H2 read at least t1 and
// took at least t1+1. Reads that happen in the acquire script itself are
// what make this work; reading the counters in a separate step could read a
// node before H1's write landed on it. Counters only grow (set-if-greater),
// and each renewal also raises every node's counter to the holder's,
// which repairs nodes that came back empty.
//
// The token is written to every node where the lock is H1's, not just to
// the first majority that answered, so W1 is usually all live nodes, and
// H1's renewals keep writing it (also to nodes that came back empty). (With
// the second round, an acquisition call that lands late can set the key on
// a node after the token was written; that node carries the token from the
// next renewal on.)
//
// A call the client gave up on may reach a node after the release of its
// value; the release (and a waiter that gives up, on every gate node it
// called with that value, the passed-over one included) leaves a tombstone
// K:gone:<value> for one TTL, and the scripts that set K refuse a value
// with a tombstone, so such a call cannot put back a lock nobody holds
// (which would block K for a TTL, and count towards nobody's majority).
// Reset leaves one for the value it removes, living as long as the removed
// key would have: the holder's renewal, which takes back a key missing on
// a node (restarted empty), does not take it back, and the holder loses
// the lock.
//
// What breaks it: nodes losing data. The argument needs one node of W1 in
// every majority to have kept its data, so the guarantee holds while fewer
// than |W1| - N/2 members of W1 are wiped: with W1 = all 5 nodes, any two
// may restart empty or be lost; if two nodes were down when H1 acquired
// (W1 = the other 3), none of those three may be wiped until a later holder
// has written its token to the returning nodes. Wipe a majority, or run
// servers that are replicas of each other (a failover loses acknowledged
// writes), and both mutual exclusion and fencing are gone; the same
// happens if clocks drift faster than the drift allowance (1% of the TTL
// plus 2ms) or a process pause outlasts the validity it computed. Redis
// persistence (appendonly with fsync) or keeping a restarted node out for
// one TTL narrows the window; fencing checked by the resource is the last
// line, and it is only as good as the counters.
//
// # Hand-overs inside a process
//
// A holder whose process has goroutines waiting for the same key passes the
// lock to the next of them without letting go of it in Redis (see Waiting).
// The successor inherits the lock and takes the next place of the chain's
// counter, without a call to Redis: nobody else can hold the lock in
// between, and every later acquisition from Redis takes a greater counter
// (the arguments above), so a token above every place of the chain: tokens
// still grow strictly with each new holder. A chain makes at most 65,535
// hand-overs (the places of 16 bits), and only for the goroutines that
// waited when it began. Nothing is handed on after the validity ends, and
// a chain of hand-overs confirms the lock in Redis at least once per
// renewal interval, like a single hold, so it notices a lost lock (Reset, a
// server restarted empty) no later than one hold would. AdvanceFence
// raises the places still to be handed in its process, and ends the chain
// when none of them would be above what it was given. The successor checks
// the validity again when it takes the lock, and the floor AdvanceFence
// set: one that paused past the validity, or whose chain has no place
// above the floor, gives the lock back and acquires from Redis instead.
//
// # Waiting
//
// Within a process, goroutines queue locally (FIFO) and one of them talks to
// Redis for the key. A process that takes the lock serves the goroutines
// that were waiting for it at that moment by hand-over (no Redis call but
// one confirmation per renewal interval, see above) and then gives it back
// to all: batching makes contended locks cheap without starving other
// processes, since each goroutine gets one turn per batch of its process.
//
// Locker: waiting processes queue on the server (K:queue, oldest first) and
// a release hands the lock straight to the oldest of them, publishing the
// hand-over on that process's channel; the woken waiter already holds the
// lock, so nobody is overtaken and a hand-over costs one script and one
// message. A waiter that died keeps its place until its wait deadline, and
// a lock handed to it blocks the key for one TTL, like a holder that died.
//
// Redlock: contenders first queue at the key's gate node (picked by the
// key's hash among the nodes sorted by address), and only the first in
// line runs the full round, so contenders woken by the same release do not
// split the votes; the gate decides nothing about safety. A gate node that
// does not answer is passed over for the next node in name order, and a
// gate that stays taken with no release announced, or a first-in-line that
// does not take a free gate, is bypassed. A release publishes the
// releasing token on every node; waiters look again when they hear it,
// and so does the releasing process's own next waiter, which joins the end
// of the line. A waiter sleeps once a majority of its subscriptions is
// confirmed: a release that succeeded was announced on a majority, which
// shares a node with it, and a server that is down or hung never confirms. After a split vote (nobody reached a
// majority) contenders back off for a random, growing while. In both, polling is only a fallback (lost messages, a
// holder that died), and the wait is bounded by WithWait, the context's
// deadline, or twice the TTL.
package redislock
