package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/flashsale/stock/internal/locking"
)

// The fencing token of the package documentation is locking's two-part
// token: base + R<<locking.PlaceBits + i, with etcd's revision R as the
// epoch and the name's fence key as the base. Each hold carries its
// batch's locking.Batch; this file begins batches, hands on their places,
// and raises the fence base.

// takeOver makes a hold handed over inside the process its new holder's:
// the next place of the batch, or, when none can be trusted, a new batch:
// it writes the key again (only if it is still the hold's) and takes that
// write's revision for the token, which orders the new holder after every
// earlier one. A holder whose token is not above a fence floor raised
// meanwhile takes another through it too (acquire).
func (l *Locker) takeOver(ctx context.Context, h *hold) error {
	if err := h.keyCtx.Err(); err != nil {
		return context.Cause(h.keyCtx)
	}
	// The next place of the batch: no write (package documentation). It
	// must be in the batch, above this process's fence floor, and the batch
	// trusted for a third of the TTL from the request that established it,
	// as a renewal would be. A floor at or above the next place makes the
	// next holder write the key again and begin a new batch, above the
	// fence. Batch.Next alone would skip to the place just above the floor,
	// which orders holders as well, but this package has always gone to
	// etcd there, and a test counts on it to make a takeOver call etcd
	// (TestHandOverPassedOnWhenTheWaiterGivesUpInTakeOver).
	if floor := l.floor(h.name); h.token >= floor {
		if token, ok := h.batch.Next(floor, l.cfg.ttl/3); ok {
			h.token = token
			return nil
		}
	}
	sent := time.Now()
	var resp *clientv3.TxnResponse
	err := l.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = l.client.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.createRev)).
			Then(clientv3.OpPut(h.key, "", clientv3.WithLease(h.sess.id)), clientv3.OpGet(l.fenceKey(h.name))).
			Commit()
		return err
	})
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		l.loseSession(h.sess, err)
		return context.Cause(h.sess.ctx)
	}
	if err != nil {
		return l.nodeError(fmt.Errorf("take over %s: %w", h.key, err))
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: %s is gone", locking.ErrLockLost, h.key)
	}
	base, err := fenceBase(resp.Responses[1].GetResponseRange().Kvs)
	if err != nil {
		return err
	}
	return h.beginBatch(base, resp.Header.Revision, sent)
}

// beginBatch makes h the first holder of a batch established at revision
// rev (read or written by a request sent at sent), over the fence base.
func (h *hold) beginBatch(base, rev int64, sent time.Time) error {
	token, err := h.batch.Begin(base, rev, sent)
	if err != nil {
		return fmt.Errorf("etcdlock: tokens of %s at revision %d: %w", h.name, rev, err)
	}
	h.token = token
	return nil
}

// AdvanceFence makes every later token of name greater than atLeast, for a
// resource that has seen a token from an etcd whose data was lost (its
// revisions began again): it raises the fence base, and this process
// hands on no place of a batch at or below it.
func (l *Locker) AdvanceFence(ctx context.Context, name string, atLeast int64) error {
	// A fence no token can pass is refused before anything is written
	// (BaseAbove's check of atLeast; epoch 0 always fits).
	if _, err := locking.BaseAbove(atLeast, 0); err != nil {
		return fmt.Errorf("etcdlock: advance the fence of %s: %w", name, err)
	}
	// The floor (this process hands on no place of an earlier batch at
	// or below atLeast, and begins no lease with such a token) is raised
	// once the base is, not before: a holder whose token is not above the
	// floor writes its key again for another, and that write must land
	// above it. Raised first, the floor would send every holder that
	// writes meanwhile round again for nothing, and, were the base never
	// raised (a failure here), for as long as the name is in use.
	l.use(name)
	defer l.done(name)
	key := l.fenceKey(name)
	for {
		resp, err := l.client.Get(ctx, key)
		if err != nil {
			return l.nodeError(fmt.Errorf("read the fence of %s: %w", name, err))
		}
		base, err := fenceBase(resp.Kvs)
		if err != nil {
			return err
		}
		// Every later batch's token is base' + R'<<PlaceBits with base'
		// >= base and R' at least this read's revision (a reader's R' may
		// equal it). The base is raised only as far as that needs
		// (locking.BaseAbove): raising it to atLeast itself would add a
		// revision's worth of tokens at every call, and tokens would run
		// out.
		need, err := locking.BaseAbove(atLeast, resp.Header.Revision)
		if err != nil {
			return fmt.Errorf("etcdlock: advance the fence of %s: %w", name, err)
		}
		if base >= need {
			l.raiseFloor(name, atLeast)
			return nil
		}
		var modRev int64
		if len(resp.Kvs) > 0 {
			modRev = resp.Kvs[0].ModRevision
		}
		put, err := l.client.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", modRev)).
			Then(clientv3.OpPut(key, strconv.FormatInt(need, 10))).
			Commit()
		if err != nil {
			return l.nodeError(fmt.Errorf("advance the fence of %s: %w", name, err))
		}
		if put.Succeeded {
			l.raiseFloor(name, atLeast)
			return nil
		}
	}
}

// fenceBase is the fence base a read of the name's fence key found: 0
// until AdvanceFence first writes it.
func fenceBase(kvs []*mvccpb.KeyValue) (int64, error) {
	if len(kvs) == 0 {
		return 0, nil
	}
	base, err := strconv.ParseInt(string(kvs[0].Value), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("fence base %q: %w", kvs[0].Key, err)
	}
	return base, nil
}
