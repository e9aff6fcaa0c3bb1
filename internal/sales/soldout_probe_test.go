package sales

import (
	"testing"
	"time"
)

// Found by review of the probe (admit/probed). None of these is a refusal
// past a mark's time: they are the probe failing at what it is for, renewing
// a mark that stays sold out without the burst at its end, in the case where
// that matters most (a slow store: a probe waits behind the lock or the
// row's gate, up to the service's 3 s timeout against a 1 s TTL).

// TestSoldOutMarkBornWhileAnOlderProbeIsOutLetsItsOwnProbeThrough: a probe
// let through in mark 1's second half is still out when mark 1 ends; an
// order sent after that is refused by the store and sets mark 2. note copies
// mark 1's probing flag into mark 2, so in mark 2's second half no order is
// let through (every one is refused), and mark 2 ends in the burst again,
// for as long as the old probe is out.
func TestSoldOutMarkBornWhileAnOlderProbeIsOutLetsItsOwnProbeThrough(t *testing.T) {
	clock := newStepClock()
	m := clock.marks(time.Second)
	m.note("s", 1, clock.now()) // mark 1: to +1 s
	clock.step(600 * time.Millisecond)
	if _, probe := m.admit("s", 1); probe == 0 {
		t.Fatal("mark 1's second half: no probe")
	}
	// The probe is slow. Mark 1 ends; an order sent at +1 s asks the
	// store and is refused: mark 2, to +2 s.
	clock.step(400 * time.Millisecond)
	if refuse, probe := m.admit("s", 1); refuse || probe != 0 {
		t.Fatalf("past mark 1: refuse %v probe %v, want neither", refuse, probe)
	}
	m.note("s", 1, clock.now())
	clock.step(600 * time.Millisecond) // +1.6 s: mark 2's second half, mark 1's probe still out
	if refuse, probe := m.admit("s", 1); refuse || probe == 0 {
		t.Fatalf("mark 2's second half, no probe of its own out: refuse %v probe %v, want a probe (mark 2 inherited mark 1's probing flag)", refuse, probe)
	}
}

// TestSoldOutMarkIsNotPulledBackByAnOlderProbesRefusal: the same slow probe,
// sent at +0.6 s, is refused at +1.1 s, after mark 2 (a refusal sent at
// +1 s) was set. note overwrites a mark of the same quantity with the older
// observation, so mark 2 ends at +1.6 s instead of +2 s: the probe, meant to
// renew, cuts the newer mark short (and the burst comes 400 ms early).
func TestSoldOutMarkIsNotPulledBackByAnOlderProbesRefusal(t *testing.T) {
	clock := newStepClock()
	m := clock.marks(time.Second)
	m.note("s", 1, clock.now())
	clock.step(600 * time.Millisecond)
	sent := clock.now()
	_, probe := m.admit("s", 1)
	if probe == 0 {
		t.Fatal("mark 1's second half: no probe")
	}
	clock.step(400 * time.Millisecond)
	m.note("s", 1, clock.now()) // mark 2: to +2 s
	clock.step(100 * time.Millisecond)
	m.note("s", 1, sent) // the probe's refusal, answered at +1.1 s
	m.probed("s", probe)
	clock.step(500 * time.Millisecond) // +1.6 s
	if !m.refuses("s", 1) {
		t.Fatal("at +1.6 s mark 2 (a refusal sent at +1 s) no longer refuses: the probe's older refusal pulled its end back to +1.6 s")
	}
}

// TestSoldOutMarkLetsOneProbeThroughAtATimeAcrossAClear: a probe is out when
// the instance's own restock clears the mark; a refusal sent after the clear
// sets a new mark, and in its second half a second probe goes out. The
// first probe's end (probed) resets the flag the second one set, so a third
// order is let through while the second probe is still out.
func TestSoldOutMarkLetsOneProbeThroughAtATimeAcrossAClear(t *testing.T) {
	clock := newStepClock()
	m := clock.marks(time.Second)
	m.note("s", 1, clock.now())
	clock.step(600 * time.Millisecond)
	_, first := m.admit("s", 1)
	if first == 0 {
		t.Fatal("the first probe was not let through")
	}
	clock.step(time.Millisecond)
	m.clear("s") // a restock through this instance, the first probe still out
	clock.step(time.Millisecond)
	m.note("s", 1, clock.now()) // a refusal sent after the clear: a new mark
	clock.step(600 * time.Millisecond)
	if _, probe := m.admit("s", 1); probe == 0 {
		t.Fatal("the new mark's second half: no probe")
	}
	m.probed("s", first) // the first probe ends
	if refuse, probe := m.admit("s", 1); !refuse || probe != 0 {
		t.Fatalf("the second probe still out: refuse %v probe %v, want refused (the first probe's end reset the second's flag)", refuse, probe)
	}
}
