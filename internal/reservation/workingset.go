package reservation

import "time"

// stream is a SKU of the working set.
type stream struct {
	sku string
	// own: this consumer may hold pending entries of the stream (a batch
	// it could not write, or entries it held before this process knew the
	// SKU): the next read asks for those ("0") before new ones (">").
	own bool
	// claimed is when the entries other consumers left idle were last
	// claimed from the stream.
	claimed time.Time
}

// workingSet is the SKUs whose streams may hold entries, taken a round at
// a time in turn: a round's cost is bounded by roundSKUs, however many
// SKUs have unwritten orders.
type workingSet struct {
	byKey map[string]*stream
	// turn holds every stream of byKey once, in the order of their next
	// round, and streams that left byKey since (skipped when their turn
	// comes).
	turn []*stream
}

func (w *workingSet) add(sku string, own bool) (added bool) {
	if w.byKey[sku] != nil {
		return false
	}
	st := &stream{sku: sku, own: own, claimed: time.Now()}
	w.byKey[sku] = st
	w.turn = append(w.turn, st)
	return true
}

func (w *workingSet) remove(st *stream) {
	if w.byKey[st.sku] == st {
		delete(w.byKey, st.sku)
	}
}

// next returns up to n streams whose turn it is, and puts them at the end
// of the line.
func (w *workingSet) next(n int) []*stream {
	var round []*stream
	for scanned, total := 0, len(w.turn); scanned < total && len(round) < n; scanned++ {
		st := w.turn[0]
		w.turn = w.turn[1:]
		if w.byKey[st.sku] != st {
			continue // it left the set
		}
		round = append(round, st)
		w.turn = append(w.turn, st)
	}
	if cap(w.turn) > 4*len(w.turn)+64 {
		w.turn = append([]*stream(nil), w.turn...) // let the old array go
	}
	return round
}

// roundSKUs bounds the streams one round reads: with a catalog of
// unwritten orders, rounds take them in turn. A round's SKUs are the stock
// rows one transaction locks; on MariaDB, keep them under its IN-list
// threshold (in_predicate_conversion_threshold, 1,000), past which the
// list may become a join that locks rows outside it, out of order.
const roundSKUs = 256
