package dblock

import (
	"fmt"
	"testing"
	"time"
)

// A process that meets many names, each once, keeps only the recent ones:
// the marks of a sale of 100,000 SKUs, one every millisecond, with a window
// of 50 ms, stay within a few windows' worth.
func TestRecentNamesForgetsOldNames(t *testing.T) {
	const window = 50 * time.Millisecond
	r := newRecentNames(window)
	now := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	biggest := 0
	for i := range 100_000 {
		now = now.Add(time.Millisecond)
		r.mark(fmt.Sprintf("sku-%d", i), now)
		biggest = max(biggest, len(r.at))
	}
	if limit := 4 * int(window/time.Millisecond); biggest > max(limit, 2*minSweep) {
		t.Errorf("up to %d names kept; at most %d were marked within a window", biggest, window/time.Millisecond)
	}
	if !r.within("sku-99999", now) {
		t.Error("the last name marked is not within the window")
	}
	if r.within("sku-99000", now) {
		t.Error("a name marked a second ago is still within a 50 ms window")
	}
}

// Sweeping never forgets a mark still within the window.
func TestRecentNamesKeepsMarksWithinTheWindow(t *testing.T) {
	const window = time.Second
	r := newRecentNames(window)
	now := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	for i := range 10 * minSweep {
		now = now.Add(time.Millisecond) // all within one window
		r.mark(fmt.Sprintf("sku-%d", i), now)
	}
	for i := range 10 * minSweep {
		if !r.within(fmt.Sprintf("sku-%d", i), now) {
			t.Fatalf("sku-%d, marked %v ago, was forgotten", i, time.Duration(10*minSweep-i)*time.Millisecond)
		}
	}
}
