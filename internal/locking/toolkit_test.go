package locking_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/locking"
)

func TestBatchTokensGrowAndALaterEpochIsAboveEveryPlace(t *testing.T) {
	var b locking.Batch
	if _, ok := b.Next(0, time.Hour); ok {
		t.Fatal("the zero Batch handed out a place")
	}
	first, err := b.Begin(7, 10, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if first != 7+10<<locking.PlaceBits {
		t.Fatalf("first token %d, want base + epoch<<PlaceBits = %d", first, 7+10<<locking.PlaceBits)
	}
	prev := first
	for i := 1; i < locking.Places; i++ {
		tok, ok := b.Next(0, time.Hour)
		if !ok || tok != prev+1 {
			t.Fatalf("place %d: token %d ok=%v, want %d", i, tok, ok, prev+1)
		}
		prev = tok
	}
	if _, ok := b.Next(0, time.Hour); ok {
		t.Fatalf("a batch handed out more than %d places", locking.Places)
	}
	var later locking.Batch
	next, err := later.Begin(7, 11, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if next <= prev {
		t.Fatalf("the next epoch's first token %d is not above the last place %d", next, prev)
	}
}

func TestBatchHandsOnNothingPastItsTrustOrAtOrBelowTheFloor(t *testing.T) {
	var b locking.Batch
	first, err := b.Begin(0, 3, time.Now().Add(-time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := b.Next(0, time.Second); ok {
		t.Fatal("a batch begun a trust window ago handed on a place")
	}
	if _, err := b.Begin(0, 3, time.Now()); err != nil {
		t.Fatal(err)
	}
	tok, ok := b.Next(first+100, time.Hour)
	if !ok || tok != first+101 {
		t.Fatalf("with the floor at place 100: token %d ok=%v, want %d", tok, ok, first+101)
	}
	if _, ok := b.Next(first+locking.Places, time.Hour); ok {
		t.Fatal("a batch handed on a place at or below a floor above all of its places")
	}
	b.End()
	if _, ok := b.Next(0, time.Hour); ok {
		t.Fatal("an ended batch handed on a place")
	}
}

func TestTokensRefuseToOverflow(t *testing.T) {
	if _, err := locking.BatchStart(0, locking.MaxEpoch); err != nil {
		t.Fatalf("the last epoch: %v", err)
	}
	last, _ := locking.BatchStart(0, locking.MaxEpoch)
	if last+locking.Places-1 != math.MaxInt64 {
		t.Fatalf("the last batch ends at %d, want MaxInt64", last+locking.Places-1)
	}
	for _, c := range []struct{ base, epoch int64 }{{0, locking.MaxEpoch + 1}, {1, locking.MaxEpoch}, {0, -1}, {-1, 1}} {
		if _, err := locking.BatchStart(c.base, c.epoch); !errors.Is(err, locking.ErrTokensExhausted) {
			t.Errorf("BatchStart(%d, %d): %v, want ErrTokensExhausted", c.base, c.epoch, err)
		}
	}
	if _, err := locking.EpochAbove(math.MaxInt64); !errors.Is(err, locking.ErrTokensExhausted) {
		t.Errorf("EpochAbove(MaxInt64): %v, want ErrTokensExhausted", err)
	}
	if _, err := locking.BaseAbove(math.MaxInt64-locking.Places, 1); !errors.Is(err, locking.ErrTokensExhausted) {
		t.Errorf("BaseAbove near MaxInt64: %v, want ErrTokensExhausted", err)
	}
}

func TestAdvancedFencesPutTheNextBatchAboveAtLeast(t *testing.T) {
	for _, atLeast := range []int64{0, 1, 12345, 99 << locking.PlaceBits, 1 << 40} {
		epoch, err := locking.EpochAbove(atLeast)
		if err != nil {
			t.Fatal(err)
		}
		if start, _ := locking.BatchStart(0, epoch+1); start <= atLeast {
			t.Errorf("EpochAbove(%d) = %d: the next batch starts at %d", atLeast, epoch, start)
		}
		for _, first := range []int64{1, 5, 1 << 20} {
			base, err := locking.BaseAbove(atLeast, first)
			if err != nil {
				t.Fatal(err)
			}
			if start := max(base, 0) + first<<locking.PlaceBits; base >= 0 && start <= atLeast {
				t.Errorf("BaseAbove(%d, %d) = %d: a batch at that epoch starts at %d", atLeast, first, base, start)
			}
			if start := base + first<<locking.PlaceBits; start != atLeast+1 {
				t.Errorf("BaseAbove(%d, %d) = %d: the batch starts at %d, want just above (%d)", atLeast, first, base, start, atLeast+1)
			}
		}
	}
}

func TestReentryIsPerOwnerAndName(t *testing.T) {
	ownerA, ownerB := new(int), new(int)
	ctx := locking.WithHold(context.Background(), ownerA, "sku-1", "hold-1")
	if h, ok := locking.HoldOf[string](ctx, ownerA, "sku-1"); !ok || h != "hold-1" {
		t.Fatalf("HoldOf = %q, %v", h, ok)
	}
	if _, ok := locking.HoldOf[string](ctx, ownerB, "sku-1"); ok {
		t.Fatal("another owner's lock of the same name re-entered")
	}
	if _, ok := locking.HoldOf[string](ctx, ownerA, "sku-2"); ok {
		t.Fatal("another name re-entered")
	}
	if _, ok := locking.HoldOf[int](ctx, ownerA, "sku-1"); ok {
		t.Fatal("a hold of another type re-entered")
	}
}

func TestRetryRepeatsOnlyTransientFailuresWhileTheWaitLasts(t *testing.T) {
	transientErr, finalErr := errors.New("no leader"), errors.New("refused")
	calls := 0
	err := locking.Retry(context.Background(), time.Second, func(err error) bool { return errors.Is(err, transientErr) },
		func(ctx context.Context) error {
			calls++
			if _, ok := ctx.Deadline(); !ok {
				t.Error("an attempt without its own deadline")
			}
			if calls < 3 {
				return transientErr
			}
			return finalErr
		})
	if !errors.Is(err, finalErr) || calls != 3 {
		t.Fatalf("Retry = %v after %d calls, want %v after 3", err, calls, finalErr)
	}
	ctx, cancel := context.WithCancel(context.Background())
	calls = 0
	err = locking.Retry(ctx, time.Second, func(error) bool { return true }, func(context.Context) error {
		calls++
		cancel()
		return transientErr
	})
	if !errors.Is(err, transientErr) || calls != 1 {
		t.Fatalf("after the wait ended: %v after %d calls, want one call", err, calls)
	}
}

func TestNotObtainedSaysWhyTheWaitEnded(t *testing.T) {
	closed, closeAll := context.WithCancel(context.Background())
	defer closeAll()
	errGaveUp := errors.New("not obtained within 5s")
	wait, cancel := context.WithCancelCause(context.Background())
	cancel(errGaveUp)
	nodeDown := &locking.NodeError{Node: "a", Err: errors.New("refused")}
	err := locking.NotObtained(wait, closed, nodeDown, context.Canceled)
	for _, want := range []error{locking.ErrNotObtained, context.Canceled, errGaveUp, nodeDown} {
		if !errors.Is(err, want) {
			t.Errorf("NotObtained = %v: it does not say %v", err, want)
		}
	}
	if errors.Is(err, locking.ErrClosed) {
		t.Errorf("NotObtained = %v: says closed, but Close did not end the wait", err)
	}
	closeAll()
	if err := locking.NotObtained(wait, closed); !errors.Is(err, locking.ErrClosed) {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
}

// TestTheLastBatchEndsAtItsLastPlace: a batch whose last place is the
// largest token there is hands out that place and then nothing: the place
// after it would wrap to the smallest int64, and a Next that computed it
// handed the next holder a token below every earlier one (found by review:
// a fence advanced near MaxInt64 puts a batch there).
func TestTheLastBatchEndsAtItsLastPlace(t *testing.T) {
	var b locking.Batch
	prev, err := b.Begin(0, locking.MaxEpoch, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for range locking.Places - 1 {
		tok, ok := b.Next(0, time.Hour)
		if !ok || tok <= prev {
			t.Fatalf("token %d (ok=%v) after %d", tok, ok, prev)
		}
		prev = tok
	}
	if prev != math.MaxInt64 {
		t.Fatalf("the last place is %d, want MaxInt64", prev)
	}
	if tok, ok := b.Next(0, time.Hour); ok {
		t.Fatalf("after the last place the batch handed out %d", tok)
	}
	if tok, ok := b.Next(math.MaxInt64-1, time.Hour); ok {
		t.Fatalf("with the floor just below the last place the ended batch handed out %d", tok)
	}
}
