package inventory

import (
	"sync"
	"time"
)

// DefaultSoldOutTTL is how long an instance refuses a SKU's orders as sold
// out on the strength of one refusal, without asking the database or
// Redis (WithSoldOutTTL).
const DefaultSoldOutTTL = time.Second

// soldOutMarks remembers, per SKU, that an order was refused sold out, so
// that the orders after it are refused without a round trip: once a flash
// sale's units are gone, most of its orders are of this kind, and the
// cheapest answer should be the one given most.
//
// A mark is one observation: "fewer than quantity units were available at
// seen", and it refuses an order of quantity units or more until seen+ttl.
// It only ever refuses, so it cannot let through an order the stock does
// not cover. What it can do is refuse an order that units given back since
// (a return, a restock, a new sale) would cover; the bound on that is ttl:
// seen is taken before the refused order asked the store, so a mark never
// outlives the store's answer by more than ttl, and units that come back
// after the store answered are on sale to this instance at most ttl later.
// A change made through this instance clears the SKU's mark at once
// (clear), and an observation not newer than that clear is ignored (else
// a refusal of the old sale, answered late, would mark the new one).
//
// Entries live at most ttl past their last observation or clear, and are
// pruned as the map grows, so its size follows the SKUs sold out in the
// last ttl, not every SKU ever seen.
type soldOutMarks struct {
	ttl time.Duration
	now func() time.Time

	mu      sync.RWMutex
	marks   map[string]soldOutMark
	pruneAt int // the size at which note prunes the entries past their time
}

type soldOutMark struct {
	quantity  int64     // the smallest quantity refused; 0: none (a clear)
	until     time.Time // refuses until then
	clearedAt time.Time // observations seen before it are ignored
}

// minPruneAt is the size below which marks are never pruned: a few dead
// entries cost less than scanning for them.
const minPruneAt = 64

func newSoldOutMarks(ttl time.Duration, now func() time.Time) *soldOutMarks {
	return &soldOutMarks{ttl: ttl, now: now, marks: map[string]soldOutMark{}, pruneAt: minPruneAt}
}

// refuses reports whether an order of quantity units of sku is sold out by
// a mark still in its time.
func (m *soldOutMarks) refuses(sku string, quantity int64) bool {
	if m == nil {
		return false
	}
	m.mu.RLock()
	mark, ok := m.marks[sku]
	m.mu.RUnlock()
	return ok && mark.quantity > 0 && quantity >= mark.quantity && m.now().Before(mark.until)
}

// note records that an order of quantity units of sku, sent to the store at
// seen, was refused sold out.
func (m *soldOutMarks) note(sku string, quantity int64, seen time.Time) {
	if m == nil {
		return
	}
	until := seen.Add(m.ttl)
	now := m.now()
	if !now.Before(until) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	mark := m.marks[sku]
	if !seen.After(mark.clearedAt) {
		// Sent before the clear, or at the same reading of a coarse or
		// stepped clock: it may have read the stock before the units
		// came back (found by review: TestSoldOutMarkIsNotSetByARefusalReadBeforeALocalRestock).
		return
	}
	if mark.quantity > 0 && mark.quantity < quantity && now.Before(mark.until) {
		// The mark in force refuses smaller orders too: keep it. (It is
		// one observation either way; keeping the wider one only saves
		// round trips.)
		return
	}
	mark.quantity, mark.until = quantity, until
	m.marks[sku] = mark
	m.pruneLocked(now)
}

// clear forgets sku's mark: units came back to it (or a new sale started)
// through this instance, so its next order asks the store.
func (m *soldOutMarks) clear(sku string) {
	if m == nil {
		return
	}
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	// Kept for ttl, so that an older refusal answered late is ignored;
	// after that, any such refusal is past its time anyway.
	m.marks[sku] = soldOutMark{clearedAt: now, until: now.Add(m.ttl)}
	m.pruneLocked(now)
}

// pruneLocked drops the entries past their time once the map has doubled
// since the last pruning: amortised O(1) per note.
func (m *soldOutMarks) pruneLocked(now time.Time) {
	if len(m.marks) < m.pruneAt {
		return
	}
	for sku, mark := range m.marks {
		if !now.Before(mark.until) {
			delete(m.marks, sku)
		}
	}
	m.pruneAt = max(minPruneAt, 2*len(m.marks))
}

// size is the number of entries kept (for tests).
func (m *soldOutMarks) size() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.marks)
}
