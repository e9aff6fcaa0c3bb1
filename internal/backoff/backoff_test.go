package backoff_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/backoff"
)

func TestWaitsStayInTheirRanges(t *testing.T) {
	for range 1000 {
		if d := backoff.Jitter(10 * time.Millisecond); d < 5*time.Millisecond || d > 10*time.Millisecond {
			t.Fatalf("Jitter(10ms) = %v", d)
		}
		if d := backoff.Exponential(3, time.Millisecond, 25*time.Millisecond); d < 0 || d > 8*time.Millisecond {
			t.Fatalf("Exponential(3, 1ms, 25ms) = %v", d)
		}
		if d := backoff.Exponential(40, time.Millisecond, 25*time.Millisecond); d < 0 || d > 25*time.Millisecond {
			t.Fatalf("Exponential(40, 1ms, 25ms) = %v", d)
		}
	}
	if d := backoff.Exponential(3, 0, 0); d != 0 {
		t.Fatalf("Exponential with no wait = %v", d)
	}
}

func TestWaitEndsWithTheContextsCause(t *testing.T) {
	errGone := errors.New("the buyer left")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errGone)
	if err := backoff.Wait(ctx, time.Hour); !errors.Is(err, errGone) {
		t.Fatalf("Wait = %v, want the context's cause", err)
	}
	if err := backoff.Wait(context.Background(), time.Microsecond); err != nil {
		t.Fatalf("Wait = %v, want nil once d has passed", err)
	}
}
