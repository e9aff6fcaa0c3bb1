package locking

import (
	"context"
	"time"
)

// WaitContext bounds a backend's wait for a lock, the same way in every
// backend: by wait when it is set, else by ctx's own deadline, else by
// fallback (a wait with no bound would hang on a crashed holder for ever).
// The wait also ends, with cause ErrClosed, when closed ends (the
// backend's Close).
func WaitContext(ctx context.Context, wait, fallback time.Duration, closed context.Context) (context.Context, context.CancelFunc) {
	var wctx context.Context
	var cancel context.CancelFunc
	_, hasDeadline := ctx.Deadline()
	switch {
	case wait > 0:
		wctx, cancel = context.WithTimeout(ctx, wait)
	case hasDeadline:
		wctx, cancel = context.WithCancel(ctx)
	default:
		wctx, cancel = context.WithTimeout(ctx, fallback)
	}
	cctx, ccancel := context.WithCancelCause(wctx)
	stop := context.AfterFunc(closed, func() { ccancel(ErrClosed) })
	return cctx, func() { stop(); ccancel(nil); cancel() }
}
