package redislock

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/locking"
)

// JobLocker is the single-run job lock on one Redis server, with
// ShedLock's bounds, for the job scheduler (internal/jobs) when JOB_LOCK
// is redis: "at most for" is the key's expiry, "at least for" keeps the
// key after the run until that long after it was taken. Both are judged on
// Redis's clock (TIME, inside the scripts), never an instance's.
type JobLocker struct {
	rdb    redis.Cmdable
	prefix string
}

// NewJobLocker returns the job lock on rdb; its keys are "<prefix><name>".
func NewJobLocker(rdb redis.Cmdable, prefix string) *JobLocker {
	return &JobLocker{rdb: rdb, prefix: prefix}
}

//go:embed lua/take_job.lua
var takeJobSource string

// takeJob: the key holds "<owner> <taken at, ms on Redis's clock>".
var takeJob = redis.NewScript(takeJobSource)

//go:embed lua/free_job.lua
var freeJobSource string

// freeJob: only the owner's own key; kept until taken at + at least, or
// deleted if that has passed. 0: the key was not the owner's any more.
var freeJob = redis.NewScript(freeJobSource)

// JobLease is one run's hold of a job lock on Redis.
type JobLease struct {
	l      *JobLocker
	key    string
	owner  string
	ctx    context.Context
	cancel context.CancelFunc
	done   atomic.Bool
}

// TryLock takes the job lock name for at most atMost, without waiting: ok
// false when another holds it. The lease's context ends when atMost has
// passed on this instance's clock, counted from before Redis set it.
func (l *JobLocker) TryLock(ctx context.Context, name string, atMost time.Duration) (*JobLease, bool, error) {
	if atMost < time.Millisecond {
		return nil, false, fmt.Errorf("redislock: job lock %s: at most for %v", name, atMost)
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	owner := hex.EncodeToString(b)
	key := l.prefix + name
	sent := time.Now()
	n, err := takeJob.Run(ctx, l.rdb, []string{key}, owner, atMost.Milliseconds()).Int64()
	if err != nil {
		// The key may have been set, its answer lost: it expires at
		// "at most for", which is what a crashed runner costs too.
		return nil, false, fmt.Errorf("redislock: job lock %s: %w", name, err)
	}
	if n == 0 {
		return nil, false, nil
	}
	jctx, cancel := context.WithDeadlineCause(context.WithoutCancel(ctx), sent.Add(atMost-atMost/100),
		fmt.Errorf("%w: job lock %s held for its longest, %v", locking.ErrLockLost, name, atMost))
	return &JobLease{l: l, key: key, owner: owner, ctx: jctx, cancel: cancel}, true, nil
}

// Context ends when the lock's "at most" has run out.
func (j *JobLease) Context() context.Context { return j.ctx }

// Unlock gives the job lock back, but keeps it until atLeast after it was
// taken. A lock that ran out fails with ErrLockLost; a second Unlock with
// ErrNotHeld.
func (j *JobLease) Unlock(ctx context.Context, atLeast time.Duration) error {
	if !j.done.CompareAndSwap(false, true) {
		return locking.ErrNotHeld
	}
	j.cancel()
	n, err := freeJob.Run(ctx, j.l.rdb, []string{j.key}, j.owner, max(atLeast, 0).Milliseconds()).Int64()
	if err != nil {
		return fmt.Errorf("redislock: job lock %s: %w", j.key, err)
	}
	if n == 0 {
		return fmt.Errorf("%w: job lock %s ran out before its release", locking.ErrLockLost, j.key)
	}
	return nil
}
