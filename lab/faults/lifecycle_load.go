package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The requests of the lifecycle's load.
const (
	lcOrder  = "order"
	lcPay    = "pay"
	lcCancel = "cancel"
	lcRead   = "read"
)

// lcAnswer classifies one answer of the lifecycle's load.
type lcAnswer int

const (
	lcDefinite lcAnswer = iota // 200, 201, 409, 404: the service said what it did
	lcNoEffect                 // 503 busy, too many connections, refused: nothing was done
	lcUnknown                  // 503 unavailable, timeout, reset: it may have been done
	lcOther                    // any other answer (a 500 would be a bug)
)

// lcOp is one request of the lifecycle's load and its answer. State is the
// order's state in a 200 or 201, Code the error code of any other answer.
type lcOp struct {
	Kind     string
	SKU      string
	User     string
	OrderID  string
	Worker   int
	Instance int
	// Call and Ret are on the load's clock; the wall clock of the
	// database (same machine) is the load's start plus them.
	Call, Ret time.Duration
	Status    int
	Code      string
	State     string
	Answer    lcAnswer
	Err       string
}

// lcSpec bounds the lifecycle's load: workers buyers at once, each
// ordering one unit of a SKU as one of buyersPerSKU users (so a buyer
// orders again, and sometimes twice at once, which PER_USER_LIMIT=1 must
// refuse), then paying (payShare), cancelling (cancelShare) or walking
// away after a think time of up to think (longer than the hold, so that
// pays and cancels race the expiry), until duration or maxOrders.
type lcSpec struct {
	workers      int
	duration     time.Duration
	maxOrders    int
	timeout      time.Duration
	buyersPerSKU int
	payShare     float64
	cancelShare  float64
	think        time.Duration
}

// lcLoad is a running lifecycle load; every request is recorded.
type lcLoad struct {
	spec      lcSpec
	targets   []*Instance
	skus      []string
	prefix    string
	client    *http.Client
	start     time.Time
	rr        atomic.Uint64
	seq       atomic.Int64
	mu        sync.Mutex
	ops       []lcOp
	stopped   context.Context
	stop      context.CancelFunc
	done      chan struct{}
	wallStart time.Time
}

func startLifecycleLoad(ctx context.Context, targets []*Instance, skus []string, spec lcSpec) *lcLoad {
	l := &lcLoad{
		spec: spec, targets: targets, skus: skus, prefix: "b" + randomHex(3),
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: spec.workers + 32, IdleConnTimeout: 30 * time.Second}},
		done:   make(chan struct{}),
	}
	l.start = time.Now()
	l.wallStart = l.start
	l.stopped, l.stop = context.WithTimeout(ctx, spec.duration)
	var wg sync.WaitGroup
	for w := range spec.workers {
		wg.Go(func() { l.buyer(ctx, w) })
	}
	go func() {
		wg.Wait()
		l.stop()
		close(l.done)
	}()
	return l
}

func (l *lcLoad) now() time.Duration { return time.Since(l.start) }
func (l *lcLoad) wait()              { <-l.done }

// wall is a time of the load's clock on the wall clock, in microseconds
// since the epoch, as the database's times are read.
func (l *lcLoad) wall(d time.Duration) int64 { return l.wallStart.Add(d).UnixMicro() }

// buyer is one worker: order, then pay, cancel or walk away; sometimes the
// same again (a retry, answered as the first) or the other (answered
// with who won), sometimes a look at the order.
func (l *lcLoad) buyer(ctx context.Context, w int) {
	for l.stopped.Err() == nil && l.seq.Add(1) <= int64(l.spec.maxOrders) {
		sku := l.skus[rand.IntN(len(l.skus))]
		user := fmt.Sprintf("%s-%s-%d", l.prefix, sku, rand.IntN(l.spec.buyersPerSKU))
		op := l.do(ctx, w, lcOrder, sku, user, "")
		if op.Status != http.StatusCreated || op.OrderID == "" {
			// A refusal (sold out, limit reached) or no definite answer:
			// the next buyer comes a moment later, so that a sold-out SKU
			// or a dead instance does not turn the load into a spin.
			pause(ctx, time.Duration(20+rand.IntN(80))*time.Millisecond)
			continue
		}
		first, second := lcPay, lcCancel
		switch x := rand.Float64(); {
		case x < l.spec.payShare:
		case x < l.spec.payShare+l.spec.cancelShare:
			first, second = lcCancel, lcPay
		default:
			continue // walks away: the hold lapses and the sweep returns the unit
		}
		// The buyer's think time; the end of the load ends it (the order
		// is then abandoned).
		pause(l.stopped, time.Duration(rand.Int64N(int64(l.spec.think))))
		if l.stopped.Err() != nil {
			return
		}
		l.do(ctx, w, first, sku, user, op.OrderID)
		switch x := rand.Float64(); {
		case x < 0.2:
			l.do(ctx, w, first, sku, user, op.OrderID) // a retry
		case x < 0.35:
			l.do(ctx, w, second, sku, user, op.OrderID) // a change of mind
		case x < 0.6:
			l.do(ctx, w, lcRead, sku, user, op.OrderID)
		}
	}
}

// burst places n orders of one unit of sku at once from workers goroutines,
// each for a buyer of its own who walks away: n holds that lapse together,
// for the sweep to expire in batches. It returns the ids answered 201.
func (l *lcLoad) burst(ctx context.Context, sku, prefix string, n, workers int) []string {
	var next atomic.Int64
	var mu sync.Mutex
	var ids []string
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n) && ctx.Err() == nil; i = next.Add(1) {
				op := l.do(ctx, 10000+w, lcOrder, sku, fmt.Sprintf("%s-%d", prefix, i), "")
				if op.Status == http.StatusCreated {
					mu.Lock()
					ids = append(ids, op.OrderID)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return ids
}

// do sends one request to the next instance of the round robin and records
// it.
func (l *lcLoad) do(ctx context.Context, w int, kind, sku, user, id string) lcOp {
	i := int(l.rr.Add(1) % uint64(len(l.targets)))
	op := lcOp{Kind: kind, SKU: sku, User: user, OrderID: id, Worker: w, Instance: i, Call: l.now()}
	defer func() {
		l.mu.Lock()
		l.ops = append(l.ops, op)
		l.mu.Unlock()
	}()
	method, url, body := http.MethodPost, l.targets[i].URL, fmt.Sprintf(`{"user_id":%q}`, user)
	switch kind {
	case lcOrder:
		url += "/orders"
		body = fmt.Sprintf(`{"sku":%q,"quantity":1,"user_id":%q}`, sku, user)
	case lcRead:
		method, url, body = http.MethodGet, url+"/orders/"+id+"?user_id="+user, ""
	default:
		url += "/orders/" + id + "/" + kind
	}
	rctx, cancel := context.WithTimeout(ctx, l.spec.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, method, url, strings.NewReader(body))
	if err != nil {
		op.Answer, op.Err, op.Ret = lcOther, err.Error(), l.now()
		return op
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := l.client.Do(req)
	if err != nil {
		op.Ret, op.Err, op.Answer = l.now(), err.Error(), lcUnknown
		if errors.Is(err, syscall.ECONNREFUSED) {
			op.Answer = lcNoEffect // it never reached a server
		}
		return op
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	op.Ret, op.Status = l.now(), resp.StatusCode
	var b struct {
		OrderID string `json:"order_id"`
		State   string `json:"state"`
		Error   struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(raw, &b)
	op.State, op.Code = b.State, b.Error.Code
	if b.OrderID != "" {
		op.OrderID = b.OrderID
	}
	switch {
	case resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusCreated ||
		resp.StatusCode == http.StatusConflict || resp.StatusCode == http.StatusNotFound:
		op.Answer = lcDefinite
	case resp.StatusCode == http.StatusServiceUnavailable && (b.Error.Code == "busy" || b.Error.Code == "too_many_connections"):
		op.Answer = lcNoEffect
	case resp.StatusCode == http.StatusServiceUnavailable:
		// "unavailable": a backend is down, or the commit's answer was
		// lost; either way the checks take it as may-have-happened.
		op.Answer = lcUnknown
	default:
		op.Answer, op.Err = lcOther, fmt.Sprintf("%d %s", resp.StatusCode, raw)
	}
	return op
}

// snapshot returns the requests recorded so far.
func (l *lcLoad) snapshot() []lcOp {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]lcOp(nil), l.ops...)
}
