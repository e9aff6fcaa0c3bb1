package inventory

import (
	"fmt"
	"testing"
	"time"
)

// stepClock is a clock the test moves by hand.
type stepClock struct{ t time.Time }

func (c *stepClock) now() time.Time                        { return c.t }
func (c *stepClock) step(d time.Duration)                  { c.t = c.t.Add(d) }
func newStepClock() *stepClock                             { return &stepClock{t: time.Unix(1_000_000, 0)} }
func (c *stepClock) marks(ttl time.Duration) *soldOutMarks { return newSoldOutMarks(ttl, c.now) }

func TestSoldOutMarkRefusesForItsTimeOnly(t *testing.T) {
	clock := newStepClock()
	m := clock.marks(time.Second)
	sent := clock.now()
	clock.step(100 * time.Millisecond) // the store's answer took 100 ms
	m.note("s", 1, sent)
	if !m.refuses("s", 1) || !m.refuses("s", 3) {
		t.Fatal("a SKU just refused sold out is not refused again")
	}
	if m.refuses("other", 1) {
		t.Fatal("a mark refuses another SKU")
	}
	// The bound counts from when the refused order was sent, not from
	// its answer: 900 ms on, the mark is spent.
	clock.step(899 * time.Millisecond)
	if !m.refuses("s", 1) {
		t.Fatal("the mark ended before its time")
	}
	clock.step(time.Millisecond)
	if m.refuses("s", 1) {
		t.Fatal("the mark outlived its time since the refused order was sent")
	}
}

func TestSoldOutMarkRefusesOnlyWhatTheRefusalCovers(t *testing.T) {
	clock := newStepClock()
	m := clock.marks(time.Second)
	// Five units refused: fewer than five are left, maybe four.
	m.note("s", 5, clock.now())
	if m.refuses("s", 4) || m.refuses("s", 1) {
		t.Fatal("a refusal of 5 units refuses a smaller order")
	}
	if !m.refuses("s", 5) || !m.refuses("s", 6) {
		t.Fatal("a refusal of 5 units does not refuse 5 or more")
	}
	// One unit refused: none left; a later refusal of more keeps that.
	m.note("s", 1, clock.now())
	m.note("s", 7, clock.now())
	if !m.refuses("s", 1) {
		t.Fatal("a refusal of more units narrowed the mark of a refusal of one")
	}
}

func TestSoldOutMarkClearIgnoresOlderRefusals(t *testing.T) {
	clock := newStepClock()
	m := clock.marks(time.Second)
	m.note("s", 1, clock.now())
	sentBefore := clock.now()
	clock.step(10 * time.Millisecond)
	m.clear("s") // a cancel through this instance gave a unit back
	if m.refuses("s", 1) {
		t.Fatal("a clear left the mark")
	}
	// An order sent before the clear, answered sold out after it, saw the
	// stock before the unit came back: it must not mark again.
	m.note("s", 1, sentBefore)
	if m.refuses("s", 1) {
		t.Fatal("a refusal older than the clear marked the SKU")
	}
	clock.step(time.Millisecond)
	m.note("s", 1, clock.now())
	if !m.refuses("s", 1) {
		t.Fatal("a refusal after the clear did not mark")
	}
}

func TestSoldOutMarkIgnoresAnAnswerPastItsTime(t *testing.T) {
	clock := newStepClock()
	m := clock.marks(time.Second)
	sent := clock.now()
	clock.step(2 * time.Second) // an order that waited past the bound
	m.note("s", 1, sent)
	if m.refuses("s", 1) {
		t.Fatal("a refusal answered after the bound marked the SKU")
	}
}

// TestSoldOutMarksDoNotGrowWithEverySKU: a long sale of many SKUs, each
// sold out once; what is kept follows the SKUs marked within the bound.
func TestSoldOutMarksDoNotGrowWithEverySKU(t *testing.T) {
	clock := newStepClock()
	m := clock.marks(time.Second)
	peak := 0
	for i := range 100_000 {
		m.note(fmt.Sprintf("sku-%d", i), 1, clock.now())
		if i%2 == 0 {
			m.clear(fmt.Sprintf("sku-%d", i))
		}
		clock.step(time.Millisecond) // 1,000 SKUs marked per bound
		peak = max(peak, m.size())
	}
	if peak > 4*1000 {
		t.Fatalf("the marks kept %d entries for about 1,000 SKUs within the bound", peak)
	}
}

func TestSoldOutMarksOffIsNil(t *testing.T) {
	var m *soldOutMarks
	m.note("s", 1, time.Now())
	m.clear("s")
	if m.refuses("s", 1) {
		t.Fatal("a nil mark refused")
	}
}
