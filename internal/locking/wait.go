package locking

import (
	"context"
	"errors"
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

// NotObtained is a backend's error for a failed acquisition: ErrNotObtained,
// the wait's error if it ended and the caller's cause of that end, if it
// gave one (context.WithCancelCause), ErrClosed if the backend's Close
// ended it (closed is the backend's close context), and the failures that
// ended it (a wait's own cancellations left out: the wait's error says it).
func NotObtained(wait, closed context.Context, errs ...error) error {
	all := []error{ErrNotObtained}
	if err := wait.Err(); err != nil {
		all = append(all, err)
		if cause := context.Cause(wait); cause != err && !errors.Is(cause, ErrClosed) {
			all = append(all, cause)
		}
	}
	if closed.Err() != nil {
		all = append(all, ErrClosed)
	}
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			all = append(all, err)
		}
	}
	return errors.Join(all...)
}
