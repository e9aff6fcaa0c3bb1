package sales

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/flashsale/stock/internal/inventory"
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
// In the second half of a mark's time one order at a time goes to the
// store (admit's probe), and its refusal renews the mark: a sale that stays
// sold out is refused without the burst of round trips that the orders in
// flight would make the moment a mark ended. Every refusal still rests on
// an observation at most ttl old.
//
// Entries live at most ttl past their last observation or clear, and are
// pruned as the map grows, so its size follows the SKUs sold out in the
// last ttl, not every SKU ever seen.
type soldOutMarks struct {
	ttl time.Duration
	now func() time.Time

	mu      sync.RWMutex
	marks   map[string]soldOutMark
	pruneAt int    // the size at which note prunes the entries past their time
	probes  uint64 // the last probe's id
}

type soldOutMark struct {
	quantity  int64     // the smallest quantity refused; 0: none (a clear)
	until     time.Time // refuses until then
	clearedAt time.Time // observations seen before it are ignored
	// probe is the order let through to the store in this mark's second
	// half (admit) whose answer is not in yet; 0: none. An id, not a
	// flag, so that a probe of an older mark ending late does not free the
	// place of this one's (found by review).
	probe uint64
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

// Refusal implements SoldOutMark: errSoldOutByMark when refuses.
func (m *soldOutMarks) Refusal(sku string, quantity int64) error {
	if m.refuses(sku, quantity) {
		return errSoldOutByMark
	}
	return nil
}

// admit is refuses at an order's way in, with the mark renewed ahead of
// its end: in the second half of a mark's time, one order at a time (the
// probe, of the mark's own quantity, so that its refusal renews it) is let
// through to the store while the others are still refused. The probe's
// refusal renews the mark (note) before it ends, so a sale that stays sold
// out is refused without the burst of round trips that every order
// arriving at the moment a mark ended would make (one per order in flight;
// behind a lock, one after the other). Nothing is refused past until, so
// the bound is the same. A probe gets an id (not 0), which the caller hands
// back to probed when the probe's answer is in.
func (m *soldOutMarks) admit(sku string, quantity int64) (refuse bool, probe uint64) {
	if m == nil {
		return false, 0
	}
	now := m.now()
	decide := func(mark soldOutMark, ok bool) (refuse, mayProbe bool) {
		if !ok || mark.quantity == 0 || quantity < mark.quantity || !now.Before(mark.until) {
			return false, false
		}
		return true, mark.probe == 0 && quantity == mark.quantity && !now.Before(mark.until.Add(-m.ttl/2))
	}
	m.mu.RLock()
	mark, ok := m.marks[sku]
	m.mu.RUnlock()
	if refuse, mayProbe := decide(mark, ok); !mayProbe {
		return refuse, 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	mark, ok = m.marks[sku]
	refuse, mayProbe := decide(mark, ok)
	if !mayProbe {
		return refuse, 0
	}
	m.probes++
	mark.probe = m.probes
	m.marks[sku] = mark
	return false, mark.probe
}

// probed ends probe, which admit let through: its refusal was noted (or it
// was not refused, and the mark ends in its time); the next order in the
// mark's second half may probe again. A probe of an older mark frees
// nothing.
func (m *soldOutMarks) probed(sku string, probe uint64) {
	if m == nil || probe == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if mark, ok := m.marks[sku]; ok && mark.probe == probe {
		mark.probe = 0
		m.marks[sku] = mark
	}
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
	if mark.quantity > 0 && now.Before(mark.until) &&
		(mark.quantity < quantity || (mark.quantity == quantity && !until.After(mark.until))) {
		// The mark in force refuses smaller orders too, or as small
		// ones for as long: keep it. (It is one observation either way;
		// keeping the wider one only saves round trips, and an older
		// refusal answered late, a probe's most often, must not cut a
		// newer mark short: found by review.)
		return
	}
	// A newer observation: a probe still out belongs to the mark it
	// replaces, and this one may have its own.
	mark.quantity, mark.until, mark.probe = quantity, until, 0
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

// markAnswers reports whether the sold-out mark refuses req without asking
// the store. Never an order with a key: a retry of an order that was taken
// must get its order back, and only the strategy knows where the key is
// (the reservation strategies' reach the database later). Not under a
// per-buyer limit here: the store answers a buyer at the limit
// limit_reached before it looks at the stock, and the mark, which does not
// know the buyer's units, would answer sold_out instead, an answer that
// invites a retry once units come back (found by review:
// TestSoldOutMarkAnswersABuyerAtTheLimitAsTheStoreWould); only the way in
// reads them (markAdmits).
func (s *Service) markAnswers(req inventory.Request) bool {
	return req.IdempotencyKey == "" && s.limit == 0 && s.soldOut.refuses(req.SKU, req.Quantity)
}

// markAdmits is markAnswers at an order's way in, where in the mark's
// second half one order at a time is let through as the probe that renews
// it (soldOutMarks.admit). Under a per-buyer limit the mark answers here
// too, with the buyer's units read (refusalAtMark): the sold-out answers
// are most of a sale's, and the store's answer to each, a transaction
// that claims the buyer's units and gives them back, cost the limited
// burst more than half its rate (issue 38 item 6).
func (s *Service) markAdmits(req inventory.Request) (refuse bool, probe uint64) {
	if req.IdempotencyKey != "" || (s.limit > 0 && s.buyers == nil) {
		return false, 0
	}
	return s.soldOut.admit(req.SKU, req.Quantity)
}

// refusalAtMark is the answer to an order under a per-buyer limit that the
// mark refuses: limit_reached when the buyer's units, read now, leave no
// room for it (the store claims the buyer's units before it looks at the
// stock, and answers that), sold_out otherwise; nil when the units could
// not be read, and the order asks the store as it would unmarked. ctx is
// the order's: its deadline bounds the read and the order after it.
func (s *Service) refusalAtMark(ctx context.Context, req inventory.Request) error {
	units, err := s.buyers.unitsOf(ctx, req.SKU, req.UserID)
	switch {
	case err != nil:
		s.log.Debug("buyer's units not read; the store answers", "sku", req.SKU, "err", err)
		return nil
	case units+req.Quantity > s.limit:
		return s.limitReached(req)
	}
	return s.soldOutError(req)
}

// markFor is the mark a taker may ask again while req waits its turn
// (PendingOrder.Mark): nil where markAnswers would not answer, and for the
// probe, which the mark it renews must not refuse.
func (s *Service) markFor(req inventory.Request, probe bool) inventory.SoldOutMark {
	if probe || req.IdempotencyKey != "" || s.limit > 0 || s.soldOut == nil {
		return nil
	}
	return s.soldOut
}

// errSoldOutByMark is a refusal by the sold-out mark, not by the store.
var errSoldOutByMark = fmt.Errorf("%w (refused by this instance's sold-out mark)", inventory.ErrSoldOut)

// soldOutError is the refusal of an order the stock does not cover.
func (s *Service) soldOutError(req inventory.Request) error {
	return fmt.Errorf("%w: fewer than %d units of %q are available", inventory.ErrSoldOut, req.Quantity, req.SKU)
}

// limitReached is the refusal of an order past the per-user limit.
func (s *Service) limitReached(req inventory.Request) error {
	return fmt.Errorf("%w: %q may hold or have paid for at most %d units of %q in this sale", inventory.ErrLimitReached, req.UserID, s.limit, req.SKU)
}
