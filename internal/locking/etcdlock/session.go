package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/flashsale/stock/internal/locking"
)

// session is one etcd lease kept alive by its own loop: ctx ends (cause
// wrapping locking.ErrLockLost) when the lease can no longer be trusted.
type session struct {
	id     clientv3.LeaseID
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   chan struct{} // closed to end the renewals (Close)
	ended  chan struct{} // closed when the renewal loop has returned
}

// session returns the current session, granting a new lease when there is
// none.
func (l *Locker) session(ctx context.Context) (*session, error) {
	current := func() (*session, error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.closed {
			return nil, locking.ErrClosed
		}
		if l.sess != nil && l.sess.ctx.Err() == nil {
			return l.sess, nil
		}
		return nil, nil
	}
	if s, err := current(); s != nil || err != nil {
		return s, err
	}
	select {
	case l.grant <- struct{}{}:
		defer func() { <-l.grant }()
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	if s, err := current(); s != nil || err != nil {
		return s, err
	}
	sent := time.Now()
	resp, err := l.client.Grant(ctx, l.cfg.ttlSeconds())
	if err != nil {
		return nil, l.nodeError(fmt.Errorf("grant a lease: %w", err))
	}
	s := &session{id: resp.ID, stop: make(chan struct{}), ended: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		s.cancel(locking.ErrClosed)
		rctx, cancel := context.WithTimeout(context.Background(), l.cfg.opTimeout)
		_, _ = l.client.Revoke(rctx, s.id)
		cancel()
		return nil, locking.ErrClosed
	}
	l.sess = s
	l.wg.Add(1)
	go l.keepAlive(s, sent.Add(validity(resp.TTL)))
	return s, nil
}

// validity is how long a lease granted or renewed with ttl seconds can be
// trusted from the moment the request was sent: etcd counts the TTL from
// when it received it, later; 1% is left for the clocks' drift.
func validity(ttl int64) time.Duration {
	d := time.Duration(ttl) * time.Second
	return d - d/100
}

// loseSession ends s: every lease on it ends with a cause wrapping
// locking.ErrLockLost, the next acquisition grants a new lease, and s's
// lease is revoked in the background, so that its keys leave the queues at
// once rather than when etcd expires it (a renewal can fail while the lease
// still lives there).
func (l *Locker) loseSession(s *session, cause error) {
	if s.ctx.Err() != nil {
		return
	}
	s.cancel(fmt.Errorf("%w: etcd lease %x: %w", locking.ErrLockLost, s.id, cause))
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sess == s {
		l.sess = nil
	}
	if l.closed {
		return // Close revokes what it finds
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.opTimeout)
		defer cancel()
		_, _ = l.client.Revoke(ctx, s.id)
	}()
}

// keepAlive renews s's lease every third of the TTL until Close. The
// validity is watched by a timer of its own, not by this loop: a renewal
// or an observer that blocks cannot keep a lease alive past its validity.
func (l *Locker) keepAlive(s *session, validUntil time.Time) {
	defer l.wg.Done()
	defer close(s.ended)
	expiry := time.AfterFunc(time.Until(validUntil), func() {
		l.loseSession(s, errors.New("validity ended before a renewal came back"))
	})
	defer expiry.Stop()
	every := l.cfg.ttl / 3
	tick := time.NewTimer(every)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-s.ctx.Done():
			return
		case <-tick.C:
		}
		sent := time.Now()
		ctx, cancel := context.WithDeadline(s.ctx, validUntil)
		resp, err := l.client.KeepAliveOnce(ctx, s.id)
		cancel()
		if err == nil && resp.TTL <= 0 {
			err = errors.New("the lease has expired")
		}
		if err != nil {
			select {
			case <-s.stop:
				return
			default:
			}
			// The work stops before the observer hears of the failure.
			l.loseSession(s, fmt.Errorf("renewal failed: %w", err))
			if l.cfg.onRenew != nil {
				l.cfg.onRenew(err)
			}
			return
		}
		if !expiry.Stop() {
			return // the validity ended while the renewal was on its way: lost
		}
		validUntil = sent.Add(validity(resp.TTL))
		expiry.Reset(time.Until(validUntil))
		if l.cfg.onRenew != nil {
			l.cfg.onRenew(nil)
		}
		tick.Reset(every)
	}
}
