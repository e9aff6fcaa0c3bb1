package reservation

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/inventory"
)

// Close implements Reservations. It lists the SKU in the catalog
// first: a sale must never be open in Redis without being listed, or a
// stream whose instance died before its consumer read it would be found
// by no sweep (found by review, with the listing after the load).
func (s *Store) Close(ctx context.Context, sku string, epoch int64) error {
	return s.onOneConnection(func(c redis.Cmdable) error { return s.close(ctx, c, sku, epoch) })
}

func (s *Store) close(ctx context.Context, c redis.Cmdable, sku string, epoch int64) error {
	if err := s.list(ctx, c, sku, epoch); err != nil {
		return err
	}
	k := s.keys(sku)
	seen, err := closeScript.Run(ctx, c, []string{k.sale, k.epoch}, epoch).Int64()
	if err == nil && seen >= epoch {
		return &SaleNumberBehind{Seen: seen}
	}
	if err != nil {
		return fmt.Errorf("%w: close the sale of %q in Redis: %w", inventory.ErrUnavailable, sku, err)
	}
	return s.replicatedOn(ctx, c)
}

// list lists sku in the catalog with the number of its latest sale.
func (s *Store) list(ctx context.Context, c redis.Cmdable, sku string, epoch int64) error {
	if err := c.ZAddArgs(ctx, s.catalogKey(), redis.ZAddArgs{GT: true, Members: []redis.Z{{Score: float64(epoch), Member: sku}}}).Err(); err != nil {
		return fmt.Errorf("%w: list %q in the catalog: %w", inventory.ErrUnavailable, sku, err)
	}
	return nil
}

// Load implements Reservations. It lists the SKU in the catalog
// again first (Close did, but a Redis that came back from an older copy
// since may have lost the listing; found by review): a sale is never open
// unlisted.
func (s *Store) Load(ctx context.Context, sku string, n, epoch int64, w inventory.SaleWindow) error {
	return s.load(ctx, sku, n, epoch, w, "")
}

// Resume implements Reservations: Load, only on a server that
// holds sale epoch's announcement (Close) and no sale since.
func (s *Store) Resume(ctx context.Context, sku string, n, epoch int64, w inventory.SaleWindow) error {
	return s.load(ctx, sku, n, epoch, w, "resume")
}

func (s *Store) load(ctx context.Context, sku string, n, epoch int64, w inventory.SaleWindow, mode string) error {
	return s.onOneConnection(func(c redis.Cmdable) error { return s.loadOn(ctx, c, sku, n, epoch, w, mode) })
}

func (s *Store) loadOn(ctx context.Context, c redis.Cmdable, sku string, n, epoch int64, w inventory.SaleWindow, mode string) error {
	if err := s.list(ctx, c, sku, epoch); err != nil {
		return err
	}
	k := s.keys(sku)
	if err := loadScript.Run(ctx, c, []string{k.sale, k.epoch, k.idem, k.orders, k.buyers, k.returned, k.open, k.restocks}, epoch, n, Group, windowBound(w.StartsAt), windowBound(w.EndsAt), mode).Err(); err != nil {
		if strings.HasPrefix(err.Error(), "LOST") {
			return fmt.Errorf("%w: %q: Redis lost the start of its sale, and with it maybe orders the sale took; start a new sale: %w", ErrSaleNotLoaded, sku, err)
		}
		if strings.HasPrefix(err.Error(), "STALE") {
			// A newer sale was started meanwhile: this one is over.
			return fmt.Errorf("%w: %w: load %q: %w", inventory.ErrBusy, inventory.ErrStaleSale, sku, err)
		}
		return fmt.Errorf("%w: load the sale of %q into Redis: %w", inventory.ErrUnavailable, sku, err)
	}
	return s.replicatedOn(ctx, c)
}

// windowBound is a bound of the sale's window as the sale hash keeps it:
// Unix microseconds (the precision of the databases' clocks and of Redis's
// TIME; exact in a Lua number), "" for an open bound (the zero time). Not
// 0: a bound at or before 1970 is a bound (found by review: a sale that
// ended in 1970 sold in Redis).
func windowBound(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return strconv.FormatInt(t.UnixMicro(), 10)
}

// Return implements Reservations: returnScript, after a check of
// the sale when the server's data may have changed (as runReserve does).
// ErrStaleSale when the sale is another than the returns', ErrSaleNotLoaded
// when Redis has no sale, ErrBusy while a check runs.
func (s *Store) Return(ctx context.Context, sku string, epoch int64, returns []inventory.Order) error {
	return s.giveBack(ctx, sku, epoch, kindReturn, returns)
}

// Restock implements Reservations: returnScript for restocks,
// as Return.
func (s *Store) Restock(ctx context.Context, sku string, epoch int64, restocks []inventory.Order) error {
	return s.giveBack(ctx, sku, epoch, kindRestock, restocks)
}

// What returnScript adds to a sale.
const (
	kindReturn  = "return"
	kindRestock = "restock"
)

// giveBack runs returnScript for batch, of kind.
func (s *Store) giveBack(ctx context.Context, sku string, epoch int64, kind string, batch []inventory.Order) error {
	// Listed before it has units again, as Load lists before it opens: a
	// sale sold out and drained may have left the catalog (Consumer.sweep),
	// and a sale with units to sell must be listed, or the orders of an
	// instance that dies before its consumer reads them would be found by
	// no sweep.
	if err := s.list(ctx, s.rdb, sku, epoch); err != nil {
		return err
	}
	for checked := false; ; checked = true {
		answer, err := s.runReturn(ctx, sku, epoch, "", kind, batch)
		if answer == "unchecked" && err == nil && !checked {
			if err := s.recheck(ctx, sku); err != nil {
				return err
			}
			continue
		}
		return returnAnswer(sku, epoch, kind, answer, err)
	}
}

// returnAnswer is the error of returnScript's answer for the sale epoch
// of sku (nil: it took the batch).
func returnAnswer(sku string, epoch int64, kind, answer string, err error) error {
	switch {
	case err != nil:
		return fmt.Errorf("%w: %s units of %q in Redis: %w", inventory.ErrUnavailable, kind, sku, err)
	case strings.HasPrefix(answer, "OK"):
		return nil
	case answer == "other":
		return fmt.Errorf("%w: Redis holds another sale of %q than sale %d of the %s", inventory.ErrStaleSale, sku, epoch, kind)
	case answer == "unloaded":
		return fmt.Errorf("%w: %q", ErrSaleNotLoaded, sku)
	case answer == "checking" || answer == "unchecked":
		return fmt.Errorf("%w: the sale of %q is being checked against the database", inventory.ErrBusy, sku)
	default:
		return fmt.Errorf("%w: unexpected reply from the return script: %q", inventory.ErrUnavailable, answer)
	}
}

// GiveBack implements Reservations: Return (kind Returns) or Restock for
// the items of several SKUs, each SKU's script atomic on its own keys as
// for one, sent in pipelines after one listing of every SKU: the relay of
// a sweep over a catalog costs a few round trips, not a few per SKU. A SKU
// whose sale only a check can settle ("unchecked": the server's data may
// have changed) goes the one-SKU way, which checks it first.
func (s *Store) GiveBack(ctx context.Context, kind RelayKind, marked []Marked) []error {
	errs := make([]error, len(marked))
	if len(marked) == 0 {
		return errs
	}
	k := kindReturn
	if kind == Restocks {
		k = kindRestock
	}
	if len(marked) == 1 {
		// One SKU (a cancel's relay): two round trips either way.
		errs[0] = s.giveBack(ctx, marked[0].SKU, marked[0].Sale, k, marked[0].Items)
		return errs
	}
	skus, sales := make([]string, len(marked)), make([]int64, len(marked))
	calls := make([]pipelinedCall, len(marked))
	for i, m := range marked {
		skus[i], sales[i] = m.SKU, m.Sale
		keys, args := s.returnCall(m.SKU, m.Sale, "", k, m.Items)
		calls[i] = pipelinedCall{keys: keys, args: args}
	}
	fail := func(err error) []error {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	if err := s.listCatalog(ctx, s.rdb, skus, sales); err != nil {
		return fail(err)
	}
	cmds, err := s.runPipelined(ctx, s.rdb, returnScript, calls)
	if err != nil {
		return fail(fmt.Errorf("%w: %s units of %d SKUs in Redis: %w", inventory.ErrUnavailable, k, len(marked), err))
	}
	for i, cmd := range cmds {
		answer, err := cmd.Text()
		if answer == "unchecked" && err == nil {
			errs[i] = s.giveBack(ctx, marked[i].SKU, marked[i].Sale, k, marked[i].Items)
			continue
		}
		errs[i] = returnAnswer(marked[i].SKU, marked[i].Sale, k, answer, err)
	}
	return errs
}

// runReturn runs returnScript for a batch of kind, under the check token
// when a check runs it ("" otherwise).
func (s *Store) runReturn(ctx context.Context, sku string, epoch int64, token, kind string, batch []inventory.Order) (string, error) {
	keys, args := s.returnCall(sku, epoch, token, kind, batch)
	return returnScript.Run(ctx, s.rdb, keys, args...).Text()
}

// returnCall is returnScript's keys and arguments for a batch of kind.
func (s *Store) returnCall(sku string, epoch int64, token, kind string, batch []inventory.Order) ([]string, []any) {
	k := s.keys(sku)
	args := make([]any, 0, 3+4*len(batch))
	args = append(args, epoch, token, kind)
	set := k.returned
	for _, o := range batch {
		if kind == kindRestock {
			args = append(args, o.ID, o.Quantity)
			set = k.restocks
		} else {
			args = append(args, o.ID, o.Quantity, o.UserID, o.Claimed)
		}
	}
	return []string{k.sale, set, k.buyers}, args
}

// returnAgain gives back, under a check of the sale (token), the units of
// every order the database returned in the sale: the set skips those
// Redis has taken back already, so a Redis that came back from an older
// copy of its data gets back what it lost and nothing twice. It runs after
// the check found that Redis took every order the database has.
func (s *Store) returnAgain(ctx context.Context, sku string, epoch int64, token string, r SaleRecheck) error {
	returned, err := r.ReturnedOrders(ctx)
	if err != nil {
		return err
	}
	restocks, err := r.Restocks(ctx)
	if err != nil {
		return err
	}
	for _, give := range []struct {
		kind  string
		batch []inventory.Order
	}{{kindReturn, returned}, {kindRestock, restocks}} {
		const size = 256
		again := 0
		for from := 0; from < len(give.batch); from += size {
			answer, err := s.runReturn(ctx, sku, epoch, token, give.kind, give.batch[from:min(from+size, len(give.batch))])
			if err != nil {
				return err
			}
			var n int
			if _, serr := fmt.Sscanf(answer, "OK %d", &n); serr != nil {
				return fmt.Errorf("%s units of %q in Redis during its check: %s", give.kind, sku, answer)
			}
			again += n
		}
		if again > 0 {
			// Those the relay had not taken yet, and any an older copy of
			// Redis's data had lost.
			s.log.Info("the check of the sale gave Redis the returns or restocks it did not have yet",
				"sku", sku, "kind", give.kind, "count", again)
		}
	}
	return nil
}

// Tally implements Reservations.
func (s *Store) Tally(ctx context.Context, sku string) (Tally, error) {
	return s.tallyOn(ctx, s.rdb, sku)
}

// TallyReplicated implements Reservations: Tally, then, when the SKU has
// a sale, a wait for the replicas on the connection that read it.
func (s *Store) TallyReplicated(ctx context.Context, sku string) (t Tally, err error) {
	err = s.onOneConnection(func(c redis.Cmdable) error {
		if t, err = s.tallyOn(ctx, c, sku); err != nil {
			return err
		}
		return s.replicatedOn(ctx, c)
	})
	return t, err
}

func (s *Store) tallyOn(ctx context.Context, c redis.Cmdable, sku string) (Tally, error) {
	k := s.keys(sku)
	v, err := tallyScript.Run(ctx, c, []string{k.sale, k.orders}).Int64Slice()
	if err != nil {
		return Tally{}, fmt.Errorf("%w: tally %q in Redis: %w", inventory.ErrUnavailable, sku, err)
	}
	if len(v) == 0 {
		return Tally{}, fmt.Errorf("%w: %q", ErrSaleNotLoaded, sku)
	}
	return Tally{
		Epoch: v[0], Initial: v[1], Available: v[2], Ordered: v[3], Orders: v[4],
		Pending: v[5], Lag: time.Duration(v[6]) * time.Millisecond,
		Returned: v[7], Returns: v[8], Restocked: v[9],
	}, nil
}

// Buyers implements Reservations: one HMGET of the SKU's buyers' counts.
func (s *Store) Buyers(ctx context.Context, sku string, userIDs []string) (map[string]int64, error) {
	v, err := s.rdb.HMGet(ctx, s.keys(sku).buyers, userIDs...).Result()
	if err != nil {
		return nil, fmt.Errorf("%w: buyers' units of %q in Redis: %w", inventory.ErrUnavailable, sku, err)
	}
	units := make(map[string]int64, len(v))
	for i, x := range v {
		str, ok := x.(string)
		if !ok {
			continue // no count: none taken
		}
		n, err := strconv.ParseInt(str, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("buyers' units of %q in Redis: %q of %q: %w", sku, str, userIDs[i], err)
		}
		units[userIDs[i]] = n
	}
	return units, nil
}
