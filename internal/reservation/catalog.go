package reservation

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/flashsale/stock/internal/inventory"
)

// A catalog's start (PUT /admin/stock) in Redis: Close and Load for every
// SKU, as a start of one does, in pipelines of pipelineChunk scripts
// instead of two round trips a SKU: 10,000 SKUs would otherwise take
// 40,000 round trips. Each SKU's script is atomic on its own keys (one
// hash slot), as it is for one start; the catalog as a whole is not, and
// needs not be: its database transaction is (every SKU closed before it
// commits, loaded after).

// pipelineChunk bounds the scripts sent in one pipeline.
const pipelineChunk = 1000

// CloseCatalog implements Reservations: Close for each SKU of skus,
// announcing sale sales[i]. A *SaleNumberBehind names the highest number
// Redis had seen among those at or above their announced sale.
func (s *Store) CloseCatalog(ctx context.Context, skus []string, sales []int64) error {
	return s.onOneConnection(func(c redis.Cmdable) error { return s.closeCatalog(ctx, c, skus, sales) })
}

func (s *Store) closeCatalog(ctx context.Context, c redis.Cmdable, skus []string, sales []int64) error {
	if err := s.listCatalog(ctx, c, skus, sales); err != nil {
		return err
	}
	calls := make([]pipelinedCall, len(skus))
	for i, sku := range skus {
		k := s.keys(sku)
		calls[i] = pipelinedCall{keys: []string{k.sale, k.epoch}, args: []any{sales[i]}}
	}
	cmds, err := s.runPipelined(ctx, c, closeScript, calls)
	if err != nil {
		return fmt.Errorf("%w: close the catalog's sales in Redis: %w", inventory.ErrUnavailable, err)
	}
	var behind *SaleNumberBehind
	for i, cmd := range cmds {
		seen, err := cmd.Int64()
		if err != nil {
			return fmt.Errorf("%w: close the sale of %q in Redis: %w", inventory.ErrUnavailable, skus[i], err)
		}
		if seen >= sales[i] && (behind == nil || seen > behind.Seen) {
			behind = &SaleNumberBehind{Seen: seen}
		}
	}
	if behind != nil {
		return behind
	}
	return s.replicatedOn(ctx, c)
}

// LoadCatalog implements Reservations: Load for each start, sale
// sales[i]. A SKU whose newer sale was started since (STALE) keeps it.
func (s *Store) LoadCatalog(ctx context.Context, starts []inventory.SaleStart, sales []int64) error {
	return s.onOneConnection(func(c redis.Cmdable) error { return s.loadCatalog(ctx, c, starts, sales) })
}

func (s *Store) loadCatalog(ctx context.Context, c redis.Cmdable, starts []inventory.SaleStart, sales []int64) error {
	skus := make([]string, len(starts))
	for i, st := range starts {
		skus[i] = st.SKU
	}
	if err := s.listCatalog(ctx, c, skus, sales); err != nil {
		return err
	}
	calls := make([]pipelinedCall, len(starts))
	for i, st := range starts {
		k := s.keys(st.SKU)
		calls[i] = pipelinedCall{
			keys: []string{k.sale, k.epoch, k.idem, k.orders, k.buyers, k.returned, k.open, k.restocks},
			args: []any{sales[i], st.Available, Group, windowBound(st.Window.StartsAt), windowBound(st.Window.EndsAt), ""},
		}
	}
	cmds, err := s.runPipelined(ctx, c, loadScript, calls)
	if err != nil {
		return fmt.Errorf("%w: load the catalog's sales into Redis: %w", inventory.ErrUnavailable, err)
	}
	var failed []error
	for i, cmd := range cmds {
		err := cmd.Err()
		switch {
		case err == nil:
		case strings.HasPrefix(err.Error(), "STALE"):
			s.log.Info("catalog start: a newer sale of the SKU was started meanwhile and is kept", "sku", starts[i].SKU, "sale", sales[i])
		default:
			failed = append(failed, fmt.Errorf("%q: %w", starts[i].SKU, err))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%w: load %d of the catalog's %d sales into Redis: %w", inventory.ErrUnavailable, len(failed), len(starts), errors.Join(failed[:min(len(failed), 3)]...))
	}
	return s.replicatedOn(ctx, c)
}

// listCatalog lists every SKU in the catalog with its sale's number, as
// list does for one (ZADD GT: a listing never goes back).
func (s *Store) listCatalog(ctx context.Context, c redis.Cmdable, skus []string, sales []int64) error {
	for from := 0; from < len(skus); from += pipelineChunk {
		to := min(from+pipelineChunk, len(skus))
		members := make([]redis.Z, 0, to-from)
		for i := from; i < to; i++ {
			members = append(members, redis.Z{Score: float64(sales[i]), Member: skus[i]})
		}
		if err := c.ZAddArgs(ctx, s.catalogKey(), redis.ZAddArgs{GT: true, Members: members}).Err(); err != nil {
			return fmt.Errorf("%w: list the catalog's SKUs: %w", inventory.ErrUnavailable, err)
		}
	}
	return nil
}

// pipelinedCall is one run of a script: its keys and arguments.
type pipelinedCall struct {
	keys []string
	args []any
}

// runPipelined runs script once per call, by its hash, in pipelines of
// pipelineChunk; a run Redis answers NOSCRIPT (it forgot its scripts) is
// sent again with the script's text. It returns each call's reply, whose
// error is the script's; err is a pipeline that failed as a whole.
func (s *Store) runPipelined(ctx context.Context, rdb redis.Cmdable, script *redis.Script, calls []pipelinedCall) ([]*redis.Cmd, error) {
	if err := script.Load(ctx, rdb).Err(); err != nil {
		return nil, fmt.Errorf("load the script: %w", err)
	}
	cmds := make([]*redis.Cmd, len(calls))
	for from := 0; from < len(calls); from += pipelineChunk {
		to := min(from+pipelineChunk, len(calls))
		if err := pipeline(ctx, rdb, calls, cmds, from, to, func(p redis.Pipeliner, c pipelinedCall) *redis.Cmd {
			return script.EvalSha(ctx, p, c.keys, c.args...)
		}); err != nil {
			return nil, err
		}
		var again []int
		for i := from; i < to; i++ {
			if isNoScript(cmds[i].Err()) {
				again = append(again, i)
			}
		}
		if len(again) > 0 {
			if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, i := range again {
					cmds[i] = script.Eval(ctx, p, calls[i].keys, calls[i].args...)
				}
				return nil
			}); err != nil && !isScriptError(cmds, again) {
				return nil, err
			}
		}
	}
	return cmds, nil
}

// pipeline sends calls[from:to] in one pipeline, their replies into cmds.
// A pipeline's error is its first command's error, which a script's own
// error reply is too: only a failure no command answered fails it.
func pipeline(ctx context.Context, rdb redis.Cmdable, calls []pipelinedCall, cmds []*redis.Cmd, from, to int, send func(redis.Pipeliner, pipelinedCall) *redis.Cmd) error {
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := from; i < to; i++ {
			cmds[i] = send(p, calls[i])
		}
		return nil
	})
	idx := make([]int, 0, to-from)
	for i := from; i < to; i++ {
		idx = append(idx, i)
	}
	if err != nil && !isScriptError(cmds, idx) {
		return err
	}
	return nil
}

// isScriptError reports whether every command of idx got an answer of
// Redis's (a reply or an error reply), not a failure of the connection.
func isScriptError(cmds []*redis.Cmd, idx []int) bool {
	for _, i := range idx {
		err := cmds[i].Err()
		if err == nil {
			continue
		}
		var re redis.Error
		if !errors.As(err, &re) {
			return false
		}
	}
	return true
}

// forEachSKU runs fn for each index of n, at most width at once, and
// returns once every one has returned.
func forEachSKU(n, width int, fn func(i int)) {
	var g errgroup.Group
	g.SetLimit(width)
	for i := range n {
		g.Go(func() error { fn(i); return nil })
	}
	_ = g.Wait()
}

// StartCatalog is the strategy's StartCatalog: the database's starts
// (with c.Key, in one transaction) close every SKU's older sale in Redis
// before they commit, then Redis loads the new ones, as StartSaleWith does
// for one SKU.
func (r *Reserved) StartCatalog(ctx context.Context, c inventory.CatalogStart) error {
	skus := make([]string, len(c.Starts))
	for i, st := range c.Starts {
		skus[i] = st.SKU
	}
	for attempt := 0; ; attempt++ {
		start := c
		start.BeforeCommit = func(ctx context.Context, sales []int64) error {
			return r.res.CloseCatalog(ctx, skus, sales)
		}
		sales, err := r.db.StartCatalogWith(ctx, start)
		var behind *SaleNumberBehind
		if errors.As(err, &behind) && attempt == 0 {
			// Number every sale above what the store has seen, once: above
			// the highest number it had seen and the highest this attempt
			// announced (its close announced each SKU's number before the
			// rollback; found by review: a SKU announced at 2S was numbered
			// 2S again and the retry failed too).
			above := behind.Seen
			for _, s := range sales {
				above = max(above, s)
			}
			c.Starts = append([]inventory.SaleStart(nil), c.Starts...)
			for i := range c.Starts {
				c.Starts[i].AtLeast = max(c.Starts[i].AtLeast, above)
			}
			continue
		}
		if err != nil {
			return err
		}
		return r.res.LoadCatalog(ctx, c.Starts, sales)
	}
}

// finishWidth bounds the SKUs a retried catalog start finishes at once.
const finishWidth = 16

// FinishCatalog is the strategy's FinishCatalog, for a retry of a catalog
// start the database recorded: FinishStart for each SKU whose sale in the
// database is still the one the start asked for (a SKU started anew since
// with other units or another window is that start's to finish), with the
// number the start gave it: the row's, less a check's renumbering within
// its stride. A start numbers a sale at a multiple of the stride; finishing
// the renumbered one would pass Resume's guard on the announcement the
// check wrote, and reopen a sale whose unwritten orders Redis lost (found
// by review). Every SKU is tried; their errors are joined.
func (r *Reserved) FinishCatalog(ctx context.Context, starts []inventory.SaleStart) error {
	skus := make([]string, len(starts))
	for i, st := range starts {
		skus[i] = st.SKU
	}
	rows, err := r.db.SaleRows(ctx, skus)
	if err != nil {
		return err
	}
	errs := make([]error, len(starts))
	forEachSKU(len(starts), finishWidth, func(i int) {
		row, ok := rows[starts[i].SKU]
		if !ok || !row.Describes(starts[i]) {
			return
		}
		errs[i] = r.FinishStart(ctx, starts[i], row.Sale/saleNumberStride*saleNumberStride)
	})
	return errors.Join(errs...)
}
