package dblock

import "time"

// recentNames remembers when each name was last marked, for window: the
// courtesy rule only asks about the last moments. It forgets older marks
// as it grows, so a process that sees many names (one lock per SKU) keeps
// only the recent ones instead of every name it ever met. Not safe for
// concurrent use: the Locker's mutex guards it.
type recentNames struct {
	window  time.Duration
	at      map[string]time.Time
	sweepAt int // the size at which mark next drops old marks
}

// minSweep is the size below which recentNames never sweeps: small maps
// cost nothing.
const minSweep = 64

func newRecentNames(window time.Duration) *recentNames {
	return &recentNames{window: window, at: make(map[string]time.Time), sweepAt: minSweep}
}

// mark records that name was seen at now. Each sweep looks at every mark
// but comes only after the map has doubled since the last one: amortised,
// a constant cost per mark.
func (r *recentNames) mark(name string, now time.Time) {
	r.at[name] = now
	if len(r.at) < r.sweepAt {
		return
	}
	for n, t := range r.at {
		if now.Sub(t) >= r.window {
			delete(r.at, n)
		}
	}
	r.sweepAt = max(minSweep, 2*len(r.at))
}

// within reports whether name was marked less than window before now.
func (r *recentNames) within(name string, now time.Time) bool {
	t, ok := r.at[name]
	return ok && now.Sub(t) < r.window
}
