package redislock

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ScriptHold is a go-redis hook for tests that, once armed, holds back the
// first script call (EVALSHA or EVAL) whose arguments match: before it is
// sent (the call has not reached Redis) or, with after, once its answer
// came (the script ran; the caller has not heard). It lets go when Let is
// called, or after 10s, to keep a broken test bounded. Exported for the
// external test package too.
type ScriptHold struct {
	match   func(args []any) bool
	after   bool
	armed   atomic.Bool
	blocked chan struct{}
	unblock chan struct{}
}

// NewScriptHold returns a hold for the calls match accepts; add it to a
// client with AddHook and Arm it.
func NewScriptHold(match func(args []any) bool, after bool) *ScriptHold {
	return &ScriptHold{match: match, after: after, blocked: make(chan struct{}), unblock: make(chan struct{})}
}

// FirstKeyIs matches a script call whose first key is key.
func FirstKeyIs(key string) func(args []any) bool {
	return func(args []any) bool { return len(args) > 3 && args[3] == key }
}

// Arm makes the hold catch the next matching call.
func (h *ScriptHold) Arm() { h.armed.Store(true) }

// Held waits (bounded) until a call is held back.
func (h *ScriptHold) Held(t *testing.T) {
	t.Helper()
	bound := time.NewTimer(10 * time.Second)
	defer bound.Stop()
	select {
	case <-h.blocked:
	case <-bound.C:
		t.Fatal("the script call to hold back never came")
	}
}

// Let lets the held call go on.
func (h *ScriptHold) Let() { close(h.unblock) }

func (h *ScriptHold) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *ScriptHold) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *ScriptHold) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := strings.ToLower(cmd.Name())
		catch := func() bool {
			return (name == "evalsha" || name == "eval") && h.match(cmd.Args()) && h.armed.CompareAndSwap(true, false)
		}
		if !h.after && catch() {
			h.hold()
		}
		err := next(ctx, cmd)
		if h.after && err == nil && catch() {
			h.hold()
		}
		return err
	}
}

func (h *ScriptHold) hold() {
	close(h.blocked)
	bound := time.NewTimer(10 * time.Second)
	defer bound.Stop()
	select {
	case <-h.unblock:
	case <-bound.C:
	}
}
