package locking

import (
	"context"
	"time"

	"github.com/flashsale/stock/internal/backoff"
)

// Retry runs call, each attempt bounded by opTimeout, again and again while
// wctx lasts and transient says the failure is one that the next attempt
// may not meet (the attempt's own timeout, a leaderless moment, a lost
// connection): the pause between attempts grows by 10 ms to 100 ms, so
// that a service refusing at once is not asked in a busy loop. Only calls
// that may be sent twice go through it: reads, and writes that compare
// first. It returns call's last error.
func Retry(wctx context.Context, opTimeout time.Duration, transient func(error) bool, call func(ctx context.Context) error) error {
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(wctx, opTimeout)
		err := call(ctx)
		cancel()
		if err == nil || wctx.Err() != nil || !transient(err) {
			return err
		}
		if backoff.Wait(wctx, min(time.Duration(attempt+1)*10*time.Millisecond, 100*time.Millisecond)) != nil {
			return err
		}
	}
}
