package locking

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Fencing tokens in two parts, the same in every backend that hands a lock
// on inside its process (redislock, etcdlock, zklock):
//
//	token = base + epoch<<PlaceBits + place
//
// epoch is what the server gave the request that began a batch of local
// hand-overs: a counter (Redis's INCR), a revision (etcd), a zxid
// (ZooKeeper). It grows with every later batch, in every process. base is
// the name's fence base (0 where the backend raises the epoch instead);
// it only grows. place is the holder's place in its batch: 0 for the
// holder that went to the server, then 1, 2, … for the goroutines it hands
// the lock on to, without a request. A later batch's epoch' > epoch puts
// all its tokens above every place of the batch before, as long as a batch
// has at most Places holders; a batch that would pass them begins a new
// one.
//
// Why not the epoch alone, as tokens often are (a key's create revision, a
// node's czxid)? Because of the local hand-over: g1 of process P holds with
// epoch 10, process Q queues with 11, g1 hands on to g2 of P. Keeping 10, g2
// cannot be told from g1; taking a later value may put g2 above Q's 11,
// which holds after it. The batch's place gives g2 a token of its own
// between g1's and Q's.

// PlaceBits is the width of a token's place part.
const PlaceBits = 16

// Places is the number of holders one batch can have.
const Places = 1 << PlaceBits

// MaxEpoch is the last epoch a token can carry: MaxEpoch<<PlaceBits plus
// every place stays below 2^63.
const MaxEpoch = 1<<(63-PlaceBits) - 1

// ErrTokensExhausted: no fencing token of a name is left above the one
// asked for (an epoch or fence base past what an int64 can carry).
var ErrTokensExhausted = errors.New("locking: the fencing tokens of this name are exhausted")

// BatchStart is the token of the first holder of a batch begun at epoch
// over the fence base base. It fails with ErrTokensExhausted when that
// batch's last place would not fit in an int64.
func BatchStart(base, epoch int64) (int64, error) {
	if epoch < 0 || epoch > MaxEpoch || base < 0 || base > math.MaxInt64-epoch<<PlaceBits-(Places-1) {
		return 0, fmt.Errorf("%w: fence base %d and epoch %d (at most %d)", ErrTokensExhausted, base, epoch, int64(MaxEpoch))
	}
	return base + epoch<<PlaceBits, nil
}

// EpochOf is the epoch of a token made with base 0.
func EpochOf(token int64) int64 { return token >> PlaceBits }

// SameEpoch reports whether two tokens made with base 0 belong to one
// batch.
func SameEpoch(a, b int64) bool { return EpochOf(a) == EpochOf(b) }

// EpochAbove is the epoch a backend that raises the epoch (not a base)
// must raise its counter to so that the next batch, one epoch above it,
// has only tokens above atLeast (AdvanceFence).
func EpochAbove(atLeast int64) (int64, error) {
	epoch := EpochOf(max(atLeast, 0))
	if epoch >= MaxEpoch {
		return 0, fmt.Errorf("%w: no token is above %d", ErrTokensExhausted, atLeast)
	}
	return epoch, nil
}

// BaseAbove is the fence base that puts every token of a batch begun at
// epoch firstEpoch or later above atLeast (AdvanceFence of a backend with a
// fence base). Raising the base to atLeast itself would also do, but would
// add a whole epoch's worth of tokens at every call, and tokens would run
// out after a few thousand fenced-off writes.
func BaseAbove(atLeast, firstEpoch int64) (int64, error) {
	if atLeast > math.MaxInt64-2*Places {
		return 0, fmt.Errorf("%w: no token is above %d", ErrTokensExhausted, atLeast)
	}
	if firstEpoch < 0 || firstEpoch > MaxEpoch {
		return 0, fmt.Errorf("%w: epoch %d (at most %d)", ErrTokensExhausted, firstEpoch, int64(MaxEpoch))
	}
	return atLeast - firstEpoch<<PlaceBits + 1, nil
}

// Batch is the tokens of one batch of local hand-overs, as its holders
// take them: the first at Begin, the next ones at Next while the batch can
// be trusted. The zero Batch has no token left: its first holder begins
// one. A Batch is not safe for concurrent use: one holder at a time has it.
type Batch struct {
	next, top int64
	began     time.Time
}

// Begin begins a batch at epoch over base, established by a request sent
// at sent (the time, not the answer's: the server may have decided at any
// moment after it), and returns its first token.
func (b *Batch) Begin(base, epoch int64, sent time.Time) (int64, error) {
	start, err := BatchStart(base, epoch)
	if err != nil {
		return 0, err
	}
	b.next, b.top, b.began = start+1, start+Places-1, sent
	return start, nil
}

// Next takes the next place's token, if the batch has one above floor
// (AdvanceFence's highest atLeast in this process) and began less than
// trust ago. Trust is a third of the lock's TTL, as a renewal would be: a
// hand-over without a request believes the lock is still this process's,
// and the belief must not outlive a lock the server lost for longer than
// one hold would. false: the next holder goes to the server and begins a
// new batch.
func (b *Batch) Next(floor int64, trust time.Duration) (int64, bool) {
	// floor >= top first: floor+1 cannot overflow past it.
	if b.next == 0 || floor >= b.top || time.Since(b.began) >= trust {
		return 0, false
	}
	token := max(b.next, floor+1)
	if token > b.top {
		return 0, false
	}
	if token == b.top {
		// The last place: the one after it may not exist (a batch can end
		// at MaxInt64, and token+1 would wrap below every token).
		b.End()
	} else {
		b.next = token + 1
	}
	return token, true
}

// End leaves no place to hand on: the next holder begins a new batch.
func (b *Batch) End() { b.next, b.top = 0, 0 }
