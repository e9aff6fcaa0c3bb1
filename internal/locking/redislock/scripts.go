package redislock

import (
	"context"
	_ "embed"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/locking"
)

// Keys of one lock named K (after the prefix):
//
//	K        the lock: a random token per holder, with a PX expiry
//	K:fence  the fencing counter; it never expires (see doc.go)
//	K:queue  waiting processes, oldest first, as
//	         "deadlineMs:ttlMs:locker:token" (deadline on the server's clock;
//	         locker is the random id of the waiter's Locker). Redlock keeps
//	         it on the key's gate node only, with locker "redlock".
//	K:wake:L single node: the channel of Locker L for K; "token fence" hands
//	         the lock to token, "" asks its waiters to poll again (Reset).
//	         One channel per Locker and key, not one per key, so a hand-over
//	         wakes only the process it concerns.
//	K:wake   Redlock: "token" says token released K, so the waiters that
//	         lost to it try again; "" asks them to poll (Reset)
//	K:gone:V a tombstone: value V was released (or its waiter gave up),
//	         for one lock TTL. A call for V that the client gave up on may
//	         still reach the server after the release; the scripts that
//	         set K or queue a waiter refuse V while its tombstone lives, so
//	         such a late call cannot create the lock again under a value
//	         nobody will delete (blocking K for a TTL). A value is never
//	         used again after its release.

// Each script's source is a file in lua/, embedded byte for byte: Redis
// knows a script by the SHA1 of its source (EVALSHA), so a file keeps its
// leading and trailing newlines and gains no header; the comments here are
// the scripts' documentation. The helpers luaGone and luaPromote are
// prepended in Go to the scripts that call their functions. The same holds
// for takeJob and freeJob (joblock.go).

// luaGone is true when value has a tombstone (see K:gone:V above).
//
//go:embed lua/gone.lua
var luaGone string

// luaPromote hands a free lock to the oldest waiter whose deadline has not
// passed, increments the fence for it and, unless it is skip, publishes the
// hand-over on the waiter's channel (lock..':wake:'..locker). Waiters that
// gave up or died are skipped on the way, and so is an entry whose token
// has a tombstone (K:gone:V): a late call may have queued a value that was
// released or gave up since, and a lock handed to it would block K for a
// TTL, held by nobody.
//
//go:embed lua/promote.lua
var luaPromote string

//go:embed lua/single_acquire.lua
var singleAcquireSource string

// singleAcquire: KEYS lock, fence, queue; ARGV token, ttl ms, wait ms, our
// queue element ("" if none, "?" if an earlier call's outcome is unknown),
// locker id. A released token (tombstone) changes nothing: {0, 0, ""}.
// Returns {fence, pttl, element}: fence > 0
// when the lock is ours (pttl is then its remaining life, also when it was
// handed to us earlier); else pttl is the holder's remaining life and element
// our place in the queue. It is idempotent, so it doubles as the poll.
//
// A free lock is taken with SET NX PX and the fence incremented in the same
// script, so a holder never exists without its fencing token. A free lock
// with waiters queued goes to the oldest waiter, not to the caller: that is
// what makes the lock fair across processes.
var singleAcquire = redis.NewScript(luaPromote + luaGone + singleAcquireSource)

//go:embed lua/single_leave.lua
var singleLeaveSource string

// singleLeave: KEYS lock, fence, queue; ARGV token, our queue element ("",
// or "?" to find it by token), successor token or "", successor ttl ms,
// successor wait ms, channel, lock ttl ms. It leaves a tombstone for token
// (K:gone:token, for the lock ttl), whatever it finds: a late call of ours
// then changes nothing. Returns {held, fence, element}. held is 1 when the lock was ours and is
// released, 0 when it was gone (expired), -1 when someone else holds it: a
// release never touches another holder's lock. With a successor (the next
// waiter of this process), fence > 0 means the lock went straight to it,
// else element is its place in the queue (at the end, or the place it
// already had). A freed lock goes to the oldest queued waiter and the
// hand-over is published.
//
// This call may land late, after the client gave up on it and the
// successor went on by itself (it polls, so it may be queued already, or
// it may have given up and left its tombstone): a successor with a
// tombstone gets nothing, and one already queued keeps its one place
// instead of being queued twice (a second entry would get the lock after
// the successor released it, under a value nobody will delete).
var singleLeave = redis.NewScript(luaPromote + luaGone + singleLeaveSource)

//go:embed lua/single_extend.lua
var singleExtendSource string

// singleExtend: KEYS lock; ARGV token, ttl ms. Compare-and-pexpire: 1 when
// the lock is ours and renewed, else 0.
var singleExtend = redis.NewScript(singleExtendSource)

//go:embed lua/reset.lua
var resetSource string

// resetScript: KEYS lock, fence, queue; ARGV ttl ms. Deletes the lock and
// its queue and tells waiters (queued ones on their Locker's channel,
// Redlock ones on the shared channel) to poll again: their places in line
// are gone. The removed value gets a tombstone (K:gone:V) that outlives
// the key it replaces (its remaining life, at least ttl): the holder's next
// renewal comes before the key would have expired, and Redlock's renewal
// takes a missing key back unless the value has a tombstone, so without it
// a holder that keeps renewing would just take the lock back and Reset
// would free nothing. A late call of the value cannot set it again either.
// The fencing counter stays: tokens only ever grow, across Resets too, or a
// store that kept the highest token it accepted would refuse every later
// holder.
var resetScript = redis.NewScript(resetSource)

// resetChunk is how many reset scripts resetKeys sends a round trip.
const resetChunk = 1000

// resetKeys runs resetScript for each of keys on c, resetChunk to a
// pipeline, each pipeline under timeout when it is not 0; the first error
// ends it. A server that lost the script (restarted since it was loaded:
// NOSCRIPT) gets it again and the chunk once more, as Script.Run falls
// back to EVAL for one key (found by review).
func resetKeys(ctx context.Context, c Client, keys []string, ttl, timeout time.Duration) error {
	if err := resetScript.Load(ctx, c).Err(); err != nil {
		return err
	}
	send := func(chunk []string) error {
		cctx, cancel := ctx, context.CancelFunc(func() {})
		if timeout > 0 {
			cctx, cancel = context.WithTimeout(ctx, timeout)
		}
		defer cancel()
		_, err := c.Pipelined(cctx, func(p redis.Pipeliner) error {
			for _, key := range chunk {
				resetScript.EvalSha(cctx, p, lockKeys(key), ms(ttl))
			}
			return nil
		})
		return err
	}
	for chunk := range slices.Chunk(keys, resetChunk) {
		err := send(chunk)
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			if err = resetScript.Load(ctx, c).Err(); err == nil {
				err = send(chunk)
			}
		}
		if err != nil {
			return fmt.Errorf("reset %d keys from %s: %w", len(chunk), chunk[0], err)
		}
	}
	return nil
}

//go:embed lua/redlock_acquire.lua
var redlockAcquireSource string

// redlockAcquire: KEYS lock, fence; ARGV token, ttl ms, proposed counter (0
// for none). Returns {1, counter, ""} when the lock on this node is ours
// (taken now with SET NX PX, or already ours from an earlier round), else
// {0, holder's pttl, holder}. The counter is read in the same script as the
// SET: that is what the fencing argument in doc.go relies on. With a
// proposal, the counter is raised to it (set-if-greater) in that same
// script, after the read: the reply is the counter as it was before, so the
// caller can tell whether its proposal was above every earlier one
// (doc.go). A released
// token (tombstone) does not take a free key: {0, 0, ""}.
var redlockAcquire = redis.NewScript(luaGone + redlockAcquireSource)

//go:embed lua/redlock_gate.lua
var redlockGateSource string

// redlockGate: KEYS lock, fence, queue; ARGV token (the lock's value), ttl
// ms, entry life ms (each call sets the caller's entry to expire that long
// from now), queue id (the caller's name in the queue, which outlives the
// tokens of its failed rounds). The
// gate of a Redlock key (one node, see quorum.tryGate): waiters whose wait
// ended are dropped from the head of the queue; a free lock goes to the
// caller only if nobody is queued or the caller is first in line. Returns
// {1, counter, ""} when the lock on this node is ours (counter: this node's
// fencing counter, from which the caller proposes its token), {0, pttl, element} when
// someone holds it, {-1, 0, element} when it is free but an older waiter is
// first; element is the caller's place in the queue. A released token
// (tombstone) changes nothing: {0, 0, ""}.
var redlockGate = redis.NewScript(luaPromote + luaGone + redlockGateSource)

//go:embed lua/redlock_gate_leave.lua
var redlockGateLeaveSource string

// redlockGateLeave: KEYS lock, fence, queue; ARGV queue id, token of a
// contender that gives up ("" for none), ttl ms. Removes the caller's place
// in the gate's queue. With a token, also deletes the lock if a gate call
// of that token set it, and leaves the token's tombstone, so a gate call
// that lands later changes nothing.
var redlockGateLeave = redis.NewScript(luaPromote + redlockGateLeaveSource)

//go:embed lua/redlock_fence.lua
var redlockFenceSource string

// redlockFence: KEYS lock, fence; ARGV token, counter. Set-if-greater of the
// fencing counter, only on a node where the lock is ours: 1 when done.
var redlockFence = redis.NewScript(redlockFenceSource)

//go:embed lua/redlock_extend.lua
var redlockExtendSource string

// redlockExtend: KEYS lock, fence; ARGV token, ttl ms, counter. Renews the lock
// if ours; if the key is missing (the node restarted empty) it takes it back,
// which is safe because the caller still holds a valid majority; and it
// raises the node's fencing counter to ours, healing a wiped counter.
// A released token (tombstone) does not take the key back.
// Returns 1 when the lock on this node is ours afterwards, else 0.
var redlockExtend = redis.NewScript(luaGone + redlockExtendSource)

//go:embed lua/redlock_release.lua
var redlockReleaseSource string

// redlockRelease: KEYS lock; ARGV token, channel, publish ("1" or "0"), ttl
// ms. Leaves a tombstone for token (K:gone:token, for the ttl) whatever it
// finds, so a call of ours that lands later changes nothing.
// Compare-and-delete, then (unless told not to) publish our token so
// waiters that lost to us try again. A contender undoing a failed round
// publishes only if it held the gate while nobody held a majority: then
// the waiters queued behind it at the gate would otherwise sleep until they
// poll.
// Returns 1 when released, 0 when the key was gone, -1 when someone else
// holds it.
var redlockRelease = redis.NewScript(redlockReleaseSource)

//go:embed lua/advance_fence.lua
var advanceFenceSource string

// advanceFence: KEYS fence; ARGV n. Set-if-greater of the fencing counter,
// whoever holds the lock: the next acquisition then takes a counter above n
// (AdvanceFence passes locking.EpochAbove of the token it was given).
var advanceFence = redis.NewScript(advanceFenceSource)

// Arguments and replies of the scripts.

func lockKeys(key string) []string { return []string{key, key + ":fence", key + ":queue"} }

func ms(d time.Duration) int64 { return max(d.Milliseconds(), 1) }

// unknownElement marks an attempt whose last queueing script may have run
// without us seeing the answer: leave then finds our entry by token.
const unknownElement = "?"

// triple parses the {integer, integer, string} reply of the scripts.
func triple(v []any) (int64, int64, string, error) {
	if len(v) == 3 {
		a, ok1 := v[0].(int64)
		b, ok2 := v[1].(int64)
		s, ok3 := v[2].(string)
		if ok1 && ok2 && ok3 {
			return a, b, s, nil
		}
	}
	return 0, 0, "", fmt.Errorf("locking: unexpected script reply %v", v)
}

// startOf is the token of the holder that took counter from K:fence: the
// first of the chain that counter begins (locking.BatchStart, with fence
// base 0). A counter outside 1..locking.MaxEpoch can only come from
// something other than this package writing K:fence.
func startOf(counter int64) (int64, error) {
	if counter < 1 {
		return 0, fmt.Errorf("%w: counter %d is below 1", locking.ErrTokensExhausted, counter)
	}
	return locking.BatchStart(0, counter)
}
