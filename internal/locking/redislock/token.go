package redislock

import (
	"errors"
	"fmt"
)

// A fencing token has two parts: the counter that the acquisition from
// Redis which began a chain of local hand-overs took (K:fence, see doc.go),
// shifted left by placeBits, plus the holder's place in that chain (0 for
// the acquirer, then 1, 2, … for the goroutines it hands the lock on to).
// Every later acquisition from Redis takes a greater counter, so its token
// is above every place of the chain without anything reserved in Redis.
//
// 16 bits leave 2^47 acquisitions from Redis per key before a token would
// overflow, and at most maxPlace hand-overs per chain.
const placeBits = 16

// maxPlace is the last place of a chain: the most hand-overs it can make.
const maxPlace = 1<<placeBits - 1

// chainStart is the token of the holder that took counter from Redis.
func chainStart(counter int64) int64 { return counter << placeBits }

// counterOf is the counter of the chain that token belongs to.
func counterOf(token int64) int64 { return token >> placeBits }

// sameChain reports whether two tokens belong to one chain's block.
func sameChain(a, b int64) bool { return counterOf(a) == counterOf(b) }

// counterFloor is what AdvanceFence raises the counter in Redis to: the
// next acquisition takes one more, and every token of that chain is above
// atLeast.
func counterFloor(atLeast int64) int64 { return counterOf(max(atLeast, 0)) }

// maxCounter is the last counter a token can carry: counter<<placeBits
// plus any place stays below 2^63.
const maxCounter = 1<<(63-placeBits) - 1

// ErrTokensExhausted: the key's fencing counter is past the last one a
// token can carry (AdvanceFence refuses to take it there).
var ErrTokensExhausted = errors.New("locking: the fencing tokens of this key are exhausted")

// startOf is chainStart for a counter read from Redis, which may be past
// maxCounter only if something other than this package wrote it.
func startOf(counter int64) (int64, error) {
	if counter < 1 || counter > maxCounter {
		return 0, fmt.Errorf("%w: counter %d is outside 1..%d", ErrTokensExhausted, counter, int64(maxCounter))
	}
	return chainStart(counter), nil
}

// checkAdvance refuses an AdvanceFence that would leave no token above
// atLeast.
func checkAdvance(atLeast int64) error {
	if counterFloor(atLeast) >= maxCounter {
		return fmt.Errorf("%w: no token is above %d", ErrTokensExhausted, atLeast)
	}
	return nil
}
