package sales

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

// TestSoldOutMarkIsRenewedByOneProbe: in a mark's first half every order is
// refused; in its second half one order at a time goes to the store (the
// probe), the others still refused; the probe's refusal renews the mark,
// and once the probe is over the next order in a second half may probe.
// Nothing is refused past the last observation's time.
func TestSoldOutMarkIsRenewedByOneProbe(t *testing.T) {
	clock := newStepClock()
	m := clock.marks(time.Second)
	m.note("s", 1, clock.now())
	var last uint64 // the last probe's id
	admit := func(q int64) (bool, bool) {
		refuse, probe := m.admit("s", q)
		if probe != 0 {
			last = probe
		}
		return refuse, probe != 0
	}
	clock.step(499 * time.Millisecond)
	if refuse, probe := admit(1); !refuse || probe {
		t.Fatalf("first half: refuse %v probe %v, want refused", refuse, probe)
	}
	clock.step(time.Millisecond)
	// Only an order of the mark's quantity probes: a refusal of 2 would
	// not renew a mark of 1 (found by review).
	if refuse, probe := admit(2); !refuse || probe {
		t.Fatalf("second half, 2 units under a mark of 1: refuse %v probe %v, want refused", refuse, probe)
	}
	if refuse, probe := admit(1); refuse || !probe {
		t.Fatalf("second half, first order: refuse %v probe %v, want the probe", refuse, probe)
	}
	if refuse, probe := admit(2); !refuse || probe {
		t.Fatalf("while the probe is out: refuse %v probe %v, want refused", refuse, probe)
	}
	if refuse, probe := m.admit("other", 1); refuse || probe != 0 {
		t.Fatal("a probe or a refusal on a SKU without a mark")
	}
	// The probe, sent at +500 ms, is refused: the mark now runs to +1.5 s.
	m.note("s", 1, clock.now())
	m.probed("s", last)
	clock.step(400 * time.Millisecond) // +0.9 s: the renewed mark's first half
	if refuse, probe := admit(1); !refuse || probe {
		t.Fatalf("after a renewal, in its first half: refuse %v probe %v, want refused", refuse, probe)
	}
	// A probe that was not refused (the unit came back) renews nothing:
	// the mark ends at its time, +1.5 s.
	clock.step(400 * time.Millisecond) // +1.3 s: past the first observation's time, in the renewed mark's second half
	if refuse, probe := admit(1); refuse || !probe {
		t.Fatalf("the renewed mark's second half: refuse %v probe %v, want the probe", refuse, probe)
	}
	m.probed("s", last)
	if _, probe := admit(1); !probe {
		t.Fatal("a probe over does not let the next order probe")
	}
	m.probed("s", last)
	clock.step(200 * time.Millisecond) // +1.5 s
	if refuse, probe := admit(1); refuse || probe {
		t.Fatalf("past the last observation's time: refuse %v probe %v, want neither", refuse, probe)
	}
	// An order smaller than the refused one is never the mark's.
	m.note("s", 3, clock.now())
	clock.step(600 * time.Millisecond)
	if refuse, probe := admit(2); refuse || probe {
		t.Fatalf("2 units under a refusal of 3: refuse %v probe %v", refuse, probe)
	}
}
