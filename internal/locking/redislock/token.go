package redislock

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
