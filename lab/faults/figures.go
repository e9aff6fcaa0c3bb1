package faults

import (
	"time"

	"github.com/flashsale/stock/lab/history"
)

// figures counts the attempts called in [from, to) and the orders whose
// first attempt was.
func figures(orders []*order, from, to time.Duration) Figures {
	var f Figures
	for _, o := range orders {
		if c := o.call(); c >= from && c < to {
			f.Orders++
			if o.outcome == history.Unknown {
				f.Unknown++
			}
		}
		for _, a := range o.attempts {
			if a.call < from || a.call >= to {
				continue
			}
			f.Requests++
			switch a.answer {
			case ansCreated:
				f.Created++
			case ansSoldOut:
				f.SoldOut++
			case ansBusy:
				f.Busy++
			case ansUnavailable:
				f.Unavailable++
			case ansMayExist:
				f.Unavailable++
				f.MayExist++
			case ansRefused:
				f.Refused++
			case ansNoAnswer:
				f.NoAnswer++
			default:
				f.Other++
			}
		}
	}
	f.Responses503 = f.Busy + f.Unavailable
	return f
}

// recovery is the time from at to the end of the first 201 answered to a
// request called at or after it (by instance, or by any when instance is
// -1); nil if there was none.
func recovery(orders []*order, at time.Duration, instance int) *float64 {
	best := time.Duration(-1)
	for _, o := range orders {
		for _, a := range o.attempts {
			if a.answer == ansCreated && a.call >= at && (instance < 0 || a.instance == instance) {
				if d := a.ret - at; best < 0 || d < best {
					best = d
				}
			}
		}
	}
	if best < 0 {
		return nil
	}
	s := seconds(best)
	return &s
}

// inFlight counts the attempts to instance that were sent before t1 and had
// not been answered at t0 (the kill was sent at t0 and was over at t1).
func inFlight(orders []*order, instance int, t0, t1 time.Duration) int {
	n := 0
	for _, o := range orders {
		for _, a := range o.attempts {
			if a.instance == instance && a.call < t1 && a.ret > t0 && a.answer != ansRefused {
				n++
			}
		}
	}
	return n
}

func seconds(d time.Duration) float64 {
	return float64(d.Round(time.Millisecond)) / float64(time.Second)
}
