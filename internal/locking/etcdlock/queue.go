package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/flashsale/stock/internal/backoff"
	"github.com/flashsale/stock/internal/locking"
)

// acquireRemote queues a new key for name in etcd and waits until it is
// the oldest. A session lost during the wait is replaced and the wait goes
// on; a failed call to etcd or the end of wctx ends it.
func (l *Locker) acquireRemote(wctx context.Context, name string) (*hold, error) {
	for {
		s, err := l.session(wctx)
		if err != nil {
			return nil, err
		}
		h, err := l.queueAndWait(wctx, s, name)
		if err == nil {
			return h, nil
		}
		if wctx.Err() != nil || s.ctx.Err() == nil {
			return nil, err
		}
		// The session ended while we waited: queue again on a new one.
	}
}

func (l *Locker) queueAndWait(wctx context.Context, s *session, name string) (*hold, error) {
	dir := l.queueDir(name)
	key := dir + strconv.FormatInt(int64(s.id), 16) + "-" + strconv.FormatInt(l.seq.Add(1), 10)
	h := &hold{name: name, key: key, sess: s}
	// The key is unique to this attempt, so the create can be sent again
	// or cleaned up without touching anybody else's.
	var resp *clientv3.TxnResponse
	err := l.retry(wctx, func(ctx context.Context) (err error) {
		resp, err = l.client.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, "", clientv3.WithLease(s.id))).
			Else(clientv3.OpGet(key)).
			Commit()
		return err
	})
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// The session's lease is gone in etcd (revoked, or expired while
		// the renewals were held up) before the renewal loop noticed: end
		// the session here, and the caller queues again on a new one.
		l.loseSession(s, err)
		return nil, context.Cause(s.ctx)
	}
	if err != nil {
		l.deleteKey(h) // the create may have landed
		return nil, l.nodeError(fmt.Errorf("queue %s: %w", key, err))
	}
	h.createRev = resp.Header.Revision
	if !resp.Succeeded {
		h.createRev = resp.Responses[0].GetResponseRange().Kvs[0].CreateRevision
	}
	for {
		// One transaction, so everything is read at one revision: the
		// predecessor, the fence base, and whether our key still exists.
		sent := time.Now()
		var resp *clientv3.TxnResponse
		err := l.retry(wctx, func(ctx context.Context) (err error) {
			resp, err = l.client.Txn(ctx).Then(
				clientv3.OpGet(dir, clientv3.WithPrefix(), clientv3.WithMaxCreateRev(h.createRev-1),
					clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(1), clientv3.WithKeysOnly()),
				clientv3.OpGet(l.fenceKey(name)),
				clientv3.OpGet(key, clientv3.WithKeysOnly()),
			).Commit()
			return err
		})
		if err != nil {
			l.deleteKey(h)
			return nil, l.nodeError(fmt.Errorf("read the queue of %s: %w", name, err))
		}
		rev := resp.Header.Revision
		pred := resp.Responses[0].GetResponseRange().Kvs
		if len(resp.Responses[2].GetResponseRange().Kvs) == 0 {
			// Our key is gone: the session expired, or Reset cleared
			// the queue. Queue again.
			if s.ctx.Err() != nil {
				return nil, context.Cause(s.ctx)
			}
			return l.queueAndWait(wctx, s, name)
		}
		if len(pred) == 0 {
			base, err := fenceBase(resp.Responses[1].GetResponseRange().Kvs)
			if err != nil {
				l.deleteKey(h)
				return nil, err
			}
			if err := h.beginBatch(base, rev, sent); err != nil {
				l.deleteKey(h)
				return nil, err
			}
			l.watchOwn(h)
			return h, nil
		}
		err = l.waitDeleted(wctx, s, string(pred[0].Key), pred[0].CreateRevision, rev)
		switch {
		case err == nil:
		case wctx.Err() == nil && s.ctx.Err() == nil && transient(err):
			// The watch ended with the member's leader (a leader was
			// killed): read the queue again, which waits for a new one.
		default:
			l.deleteKey(h)
			return nil, err
		}
	}
}

// watchOwn starts the watch of a new holder's key: its deletion by anyone
// but its holders ends the leases on it. Like a waiter's, the watch starts
// at the revision current when etcd registers it (a watch from a past
// revision is served by etcd's 100 ms catch-up loop, and holds up the
// creation of the client's next watch on the same stream: the waiters'),
// and a read once it is in place catches a deletion that came before.
func (l *Locker) watchOwn(h *hold) {
	h.keyCtx, h.keyCancel = context.WithCancelCause(h.sess.ctx)
	ctx, cancel := context.WithCancel(h.keyCtx)
	h.stopWatch = cancel
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer cancel()
		stopClose := context.AfterFunc(l.closeCtx, cancel)
		defer stopClose()
		gone := func(why string) {
			h.keyCancel(fmt.Errorf("%w: %s was deleted while held (%s)", locking.ErrLockLost, h.key, why))
		}
		for ctx.Err() == nil {
			for resp := range l.client.Watch(ctx, h.key, clientv3.WithCreatedNotify()) {
				if resp.Created {
					got, err := l.client.Get(ctx, h.key, clientv3.WithKeysOnly())
					if err == nil && (len(got.Kvs) == 0 || got.Kvs[0].CreateRevision != h.createRev) {
						gone("seen missing")
						return
					}
					continue
				}
				for _, ev := range resp.Events {
					if ev.Type == clientv3.EventTypeDelete {
						gone(fmt.Sprintf("revision %d", ev.Kv.ModRevision))
						return
					}
				}
			}
		}
	}()
}

// waitDeleted waits until the predecessor's key (created at createRev) is
// deleted; rev is the revision at which it was last seen. The watch starts
// at the revision current when etcd registers it, which etcd serves as
// writes happen: a watch from a given past revision (etcd's recipe watches
// from its read's) is served by etcd's catching-up loop, every 100 ms, as
// soon as any other write lands in between, and under contention one
// always does. A deletion before the registration is caught by reading the
// key again once the watch is in place.
func (l *Locker) waitDeleted(wctx context.Context, s *session, key string, createRev, rev int64) error {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(wctx))
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	for resp := range l.client.Watch(ctx, key, clientv3.WithCreatedNotify()) {
		if err := resp.Err(); err != nil {
			return l.nodeError(fmt.Errorf("watch %s: %w", key, err))
		}
		if resp.Created {
			if resp.Header.Revision != rev { // something was written since the key was seen
				got, err := l.client.Get(ctx, key, clientv3.WithKeysOnly())
				if err != nil {
					break
				}
				if len(got.Kvs) == 0 || got.Kvs[0].CreateRevision != createRev {
					return nil
				}
			}
			if l.parked != nil {
				l.parked(key)
			}
			continue
		}
		for _, ev := range resp.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return nil
			}
		}
	}
	switch {
	case s.ctx.Err() != nil:
		return context.Cause(s.ctx)
	case wctx.Err() != nil:
		return context.Cause(wctx)
	}
	return l.nodeError(fmt.Errorf("watch %s: closed", key))
}

// deleteNow deletes h's key if it is still h's, within WithOpTimeout; a
// deletion that fails is retried in the background. It reports
// locking.ErrLockLost when the key was no longer h's.
func (l *Locker) deleteNow(ctx context.Context, h *hold) error {
	// Last, the key's context: it hangs on the session's for as long as
	// it is not ended, and a session lives for many keys (every key ever
	// held stayed a child of it with what it holds: after 100,000 SKUs
	// sold once each, the service's Go heap held 54 MB instead of 8 MB).
	if h.keyCancel != nil {
		defer h.keyCancel(errKeyDeleted)
	}
	if h.stopWatch != nil {
		defer h.stopWatch()
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.opTimeout)
	defer cancel()
	ok, err := l.deleteOwn(dctx, h)
	if err != nil {
		l.deleteKey(h)
		return l.nodeError(fmt.Errorf("release %s: %w", h.key, err))
	}
	if !ok {
		return fmt.Errorf("%w: %s was no longer this holder's", locking.ErrLockLost, h.key)
	}
	return nil
}

// errKeyDeleted ends a key's context once its holders gave it back.
var errKeyDeleted = errors.New("etcdlock: the key was given back")

func (l *Locker) deleteOwn(ctx context.Context, h *hold) (bool, error) {
	resp, err := l.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.createRev)).
		Then(clientv3.OpDelete(h.key)).
		Commit()
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// deleteKey deletes h's key in the background, retrying until it is gone
// or the Locker closes (Close revokes the session, which deletes its
// keys). A key left in the queue would hold up every later waiter until
// its lease expired, or for ever while its session lives. A lost session's
// lease is revoked (loseSession), so its keys go anyway; the retries stop
// two TTLs after that.
func (l *Locker) deleteKey(h *hold) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		var lostAt time.Time
		for {
			ctx, cancel := context.WithTimeout(context.Background(), l.cfg.opTimeout)
			// A key created without our create revision known (its answer
			// was lost) is ours by name: delete it outright.
			var err error
			if h.createRev == 0 {
				_, err = l.client.Delete(ctx, h.key)
			} else {
				_, err = l.deleteOwn(ctx, h)
			}
			cancel()
			if err == nil {
				return
			}
			if h.sess.ctx.Err() != nil {
				if lostAt.IsZero() {
					lostAt = time.Now()
				} else if time.Since(lostAt) > 2*l.cfg.ttl {
					return // its lease has expired in etcd by now
				}
			}
			if backoff.Wait(l.closeCtx, 100*time.Millisecond) != nil {
				return
			}
		}
	}()
}
