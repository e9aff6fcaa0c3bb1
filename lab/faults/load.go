package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/flashsale/stock/lab/history"
)

// answer is what one HTTP attempt told the client.
type answer int

const (
	ansCreated     answer = iota // 201
	ansSoldOut                   // 409 sold_out
	ansBusy                      // 503 busy: nothing was deducted
	ansUnavailable               // 503 unavailable: a backend is down, nothing was deducted
	ansMayExist                  // 503 unavailable: the commit's answer was lost, the order may exist
	ansRefused                   // connection refused: the request never reached a server
	ansNoAnswer                  // timeout, reset, EOF: the request may have been processed
	ansOther                     // any other status (a 500 would be a bug)
)

// outcome is the history outcome of one attempt. A 503 unavailable counts as
// unknown for the checker whatever its message says; the database check
// holds the service to its "nothing was deducted" separately.
func (a answer) outcome() history.Outcome {
	switch a {
	case ansCreated:
		return history.OK
	case ansSoldOut:
		return history.SoldOut
	case ansBusy, ansRefused:
		return history.NoEffect
	}
	return history.Unknown
}

// mayExistMarker is in the message of a 503 unavailable whose commit outcome
// is unknown (internal/httpapi's error table).
const mayExistMarker = "may have been taken"

// attempt is one HTTP request of an order.
type attempt struct {
	instance  int
	call, ret time.Duration // since the load started
	status    int
	answer    answer
	orderID   string
	err       string
}

// order is one purchase a client wanted to make: one user id (unique in the
// run), one Idempotency-Key when the load sends them, one or more attempts.
type order struct {
	worker   int
	sku      string
	quantity int64
	userID   string
	key      string
	attempts []attempt
	outcome  history.Outcome
}

// call and ret are the order's span, first call to last return.
func (o *order) call() time.Duration { return o.attempts[0].call }
func (o *order) ret() time.Duration  { return o.attempts[len(o.attempts)-1].ret }

// loadSpec bounds a load: it places orders at up to rate per second from
// workers goroutines (an open model: an arrival that finds every worker busy
// is dropped, so a stuck instance does not slow the others' load) until
// duration has passed or maxOrders were started.
type loadSpec struct {
	workers    int
	rate       float64
	duration   time.Duration
	maxOrders  int
	timeout    time.Duration // of one HTTP attempt
	idempotent bool          // send an Idempotency-Key and retry until a definite answer
	attempts   int           // attempts per order when idempotent
	// weights, when set, gives instance i weights[i] shares of the
	// requests (default: equal shares).
	weights []int
	// perInstance, when set, caps the requests one instance has in flight,
	// as a load balancer's connection limit per backend does: an attempt
	// for an instance at its cap goes to the next instance in the round
	// robin that is not. Without it, a stopped instance that takes a large
	// share of the requests ends up holding every worker until the client
	// timeout, and the others get no load.
	perInstance int
	userPrefix  string
	// burstsOnly: no open-model load at all; the scenario places its
	// orders with burst.
	burstsOnly bool
	// skew, when above 0, draws each order's SKU from a Zipf-like
	// distribution over the SKUs in their order: the k-th (from 0) with a
	// weight of 1/(k+1)^skew (zipfWeights), so the first few take most of
	// the orders, as a catalog's hot items do. 0: every SKU alike.
	skew float64
}

// skuSet is the SKUs a load orders, with the cumulative weights of a
// skewed load (nil: uniform).
type skuSet struct {
	names []string
	cdf   []float64
}

// pick draws one SKU.
func (s *skuSet) pick() string {
	if s.cdf == nil {
		return s.names[rand.IntN(len(s.names))]
	}
	i, _ := slices.BinarySearch(s.cdf, rand.Float64())
	return s.names[min(i, len(s.names)-1)]
}

// zipfWeights returns n weights, the k-th proportional to 1/(k+1)^s,
// adding up to 1.
func zipfWeights(n int, s float64) []float64 {
	w := make([]float64, n)
	var sum float64
	for k := range w {
		w[k] = math.Pow(float64(k+1), -s)
		sum += w[k]
	}
	for k := range w {
		w[k] /= sum
	}
	return w
}

// load is a running load generator. It records every order for the
// history checker and every attempt for the figures.
type load struct {
	spec    loadSpec
	targets []*Instance
	route   []int // instance of each slot of the round robin
	client  *http.Client
	rec     *history.Recorder
	start   time.Time

	skus    atomic.Pointer[skuSet]
	rr      atomic.Uint64
	seq     atomic.Int64
	dropped atomic.Int64
	created atomic.Int64
	busy    []atomic.Int64 // requests in flight, by instance

	mu     sync.Mutex
	orders []*order
	sold   map[string]int64 // units of 201 answers, by SKU

	stop context.CancelFunc // ends the load early
	done chan struct{}
}

// startLoad starts the load on skus (SetSKUs changes them) against targets,
// round robin per attempt, as a load balancer without health checks would.
// ctx bounds every request; the load stops by itself.
func startLoad(ctx context.Context, targets []*Instance, skus []string, spec loadSpec) *load {
	if spec.attempts < 1 || !spec.idempotent {
		spec.attempts = 1
	}
	l := &load{
		spec:    spec,
		targets: targets,
		client: &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: spec.workers,
			IdleConnTimeout:     30 * time.Second,
			DisableCompression:  true,
		}},
		sold: map[string]int64{},
		done: make(chan struct{}),
		busy: make([]atomic.Int64, len(targets)),
	}
	for i := range targets {
		w := 1
		if i < len(spec.weights) {
			w = spec.weights[i]
		}
		for range w {
			l.route = append(l.route, i)
		}
	}
	l.SetSKUs(skus)
	l.rec = history.NewRecorder()
	l.start = time.Now()

	stop, cancel := context.WithTimeout(ctx, spec.duration)
	l.stop = cancel
	if spec.burstsOnly {
		cancel()
		close(l.done)
		return l
	}
	arrivals := make(chan struct{})
	var wg sync.WaitGroup
	for w := range spec.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop.Done():
					return
				case <-arrivals:
				}
				n := l.seq.Add(1)
				if n > int64(spec.maxOrders) {
					return
				}
				l.place(ctx, w, n)
			}
		}()
	}
	go func() {
		t := time.NewTicker(time.Duration(float64(time.Second) / spec.rate))
		defer t.Stop()
		for {
			select {
			case <-stop.Done():
				return
			case <-t.C:
				select {
				case arrivals <- struct{}{}:
				default:
					l.dropped.Add(1)
				}
			}
		}
	}()
	go func() {
		wg.Wait()
		cancel()
		l.client.CloseIdleConnections()
		close(l.done)
	}()
	return l
}

// burst places buyers orders on the load's SKUs from workers goroutines
// at once, each placing its next order as soon as its last was answered
// ("everyone clicks at once"), and returns when every one was answered,
// with the span of the burst on the load's clock. It is bounded: buyers
// orders, each attempt within the client timeout.
func (l *load) burst(ctx context.Context, buyers, workers int) (from, to time.Duration) {
	var next atomic.Int64
	var wg sync.WaitGroup
	from = l.now()
	for w := range workers {
		wg.Go(func() {
			for ctx.Err() == nil && next.Add(1) <= int64(buyers) {
				l.place(ctx, w, l.seq.Add(1))
			}
		})
	}
	wg.Wait()
	return from, l.now()
}

// SetSKUs changes the SKUs new orders are for (with the spec's skew, the
// first ones the most).
func (l *load) SetSKUs(skus []string) {
	set := &skuSet{names: skus}
	if l.spec.skew > 0 && len(skus) > 1 {
		w := zipfWeights(len(skus), l.spec.skew)
		set.cdf = make([]float64, len(w))
		var sum float64
		for i, x := range w {
			sum += x
			set.cdf[i] = sum
		}
	}
	l.skus.Store(set)
}

// wait blocks until every worker has finished its last order.
func (l *load) wait() { <-l.done }

// now is the time since the load started, on the clock of its attempts.
func (l *load) now() time.Duration { return time.Since(l.start) }

// soldUnits is how many units of sku were answered 201 so far.
func (l *load) soldUnits(sku string) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sold[sku]
}

func (l *load) place(ctx context.Context, worker int, n int64) {
	o := &order{
		worker:   worker,
		sku:      l.skus.Load().pick(),
		quantity: 1 + rand.Int64N(3),
		userID:   fmt.Sprintf("%s-%d", l.spec.userPrefix, n),
	}
	if l.spec.idempotent {
		o.key = "key-" + o.userID
	}
	done := l.rec.Begin(worker, o.sku, o.quantity)
	for try := 0; try < l.spec.attempts; try++ {
		a := l.send(ctx, o)
		o.attempts = append(o.attempts, a)
		if a.answer == ansCreated || a.answer == ansSoldOut || ctx.Err() != nil {
			break
		}
		// A client that got no definite answer backs off before it tries
		// again (or, without a key, before its next order): an instance
		// that refuses connections must not turn the load into a spin.
		pause(ctx, time.Duration(20+rand.IntN(30*(try+1)))*time.Millisecond)
	}
	o.outcome = logicalOutcome(o.attempts)
	done(o.outcome)

	l.mu.Lock()
	l.orders = append(l.orders, o)
	if o.outcome == history.OK {
		l.sold[o.sku] += o.quantity
	}
	l.mu.Unlock()
	if o.outcome == history.OK {
		l.created.Add(1)
	}
}

// logicalOutcome is what the client knows of an order after all its
// attempts (they share an Idempotency-Key): created if any attempt was
// answered 201; otherwise unknown if any attempt may have created it;
// otherwise what the last attempt said.
func logicalOutcome(as []attempt) history.Outcome {
	unknown := false
	for _, a := range as {
		switch a.answer.outcome() {
		case history.OK:
			return history.OK
		case history.Unknown:
			unknown = true
		}
	}
	if unknown {
		return history.Unknown
	}
	return as[len(as)-1].answer.outcome()
}

func (l *load) send(ctx context.Context, o *order) attempt {
	slot := l.rr.Add(1)
	i := l.route[slot%uint64(len(l.route))]
	if l.spec.perInstance > 0 {
		for k := range uint64(len(l.route)) {
			if j := l.route[(slot+k)%uint64(len(l.route))]; l.busy[j].Load() < int64(l.spec.perInstance) {
				i = j
				break
			}
		}
	}
	l.busy[i].Add(1)
	defer l.busy[i].Add(-1)
	a := attempt{instance: i, call: l.now()}
	ctx, cancel := context.WithTimeout(ctx, l.spec.timeout)
	defer cancel()
	body := fmt.Sprintf(`{"sku":%q,"quantity":%d,"user_id":%q}`, o.sku, o.quantity, o.userID)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.targets[i].URL+"/orders", strings.NewReader(body))
	if err != nil {
		a.answer, a.err, a.ret = ansOther, err.Error(), l.now()
		return a
	}
	req.Header.Set("Content-Type", "application/json")
	if o.key != "" {
		req.Header.Set("Idempotency-Key", o.key)
	}
	resp, err := l.client.Do(req)
	if err != nil {
		a.ret, a.err = l.now(), err.Error()
		a.answer = ansNoAnswer
		if errors.Is(err, syscall.ECONNREFUSED) {
			a.answer = ansRefused
		}
		return a
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	a.ret, a.status = l.now(), resp.StatusCode
	if err != nil {
		// The status came, the body did not: the status still says it.
		a.err = err.Error()
	}
	var b struct {
		OrderID string `json:"order_id"`
		Error   struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.Unmarshal(raw, &b)
	switch {
	case resp.StatusCode == http.StatusCreated:
		a.answer, a.orderID = ansCreated, b.OrderID
	case resp.StatusCode == http.StatusConflict && b.Error.Code == "sold_out":
		a.answer = ansSoldOut
	case resp.StatusCode == http.StatusServiceUnavailable && b.Error.Code == "busy":
		a.answer = ansBusy
	case resp.StatusCode == http.StatusServiceUnavailable && b.Error.Code == "unavailable":
		a.answer = ansUnavailable
		if strings.Contains(b.Error.Message, mayExistMarker) {
			a.answer = ansMayExist
		}
	default:
		a.answer, a.err = ansOther, fmt.Sprintf("%d %s", resp.StatusCode, raw)
	}
	return a
}

// snapshot returns the orders recorded so far.
func (l *load) snapshot() []*order {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*order(nil), l.orders...)
}

// pause waits for d or until ctx ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
