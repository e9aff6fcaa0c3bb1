package dblock_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/locking"
	"github.com/flashsale/stock/lab/testdb"
)

// withTimeZone returns dbURL with its sessions in another time zone, as an
// instance configured differently would open them.
func withTimeZone(t *testing.T, engine, dbURL string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	if engine == "postgres" {
		q.Set("timezone", "Pacific/Kiritimati") // UTC+14
	} else {
		q.Set("time_zone", "'+13:00'")
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// TestAnotherTimeZoneCannotStealALease: expiry is judged on the database's
// clock in absolute time, so an instance whose sessions run in another
// time zone sees a live lease as live (with NOW() and DATETIME, MySQL would
// have judged it hours expired).
func TestAnotherTimeZoneCannotStealALease(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine, func(t *testing.T) {
			dbURL := testdb.MigratedURL(t, engine)
			home := open(t, dbURL)
			away := open(t, withTimeZone(t, engine, dbURL))
			held, err := home.Acquire(t.Context(), "tz")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), ttl/2)
			defer cancel()
			if l, err := away.Acquire(ctx, "tz"); err == nil {
				t.Fatalf("an instance in another time zone took a live lease (token %d after %d)", l.Token(), held.Token())
			} else if !errors.Is(err, locking.ErrNotObtained) {
				t.Fatalf("Acquire = %v, want ErrNotObtained", err)
			}
			if err := held.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
			l, err := away.Acquire(t.Context(), "tz")
			if err != nil {
				t.Fatalf("the freed lock: %v", err)
			}
			if l.Token() <= held.Token() {
				t.Fatalf("token %d after %d", l.Token(), held.Token())
			}
			if err := l.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestResetEndsTheHolderAndKeepsTheCounter: a new sale frees the lock; the
// holder learns it at its next renewal, and the next token is still
// greater.
func TestResetEndsTheHolderAndKeepsTheCounter(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine, func(t *testing.T) {
			dbURL := testdb.MigratedURL(t, engine)
			l := open(t, dbURL)
			held, err := l.Acquire(t.Context(), "reset")
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Reset(t.Context(), "reset"); err != nil {
				t.Fatal(err)
			}
			select {
			case <-held.Context().Done():
			case <-time.After(ttl):
				t.Fatal("the holder of a reset lock kept its lease past a renewal")
			}
			if !errors.Is(context.Cause(held.Context()), locking.ErrLockLost) {
				t.Fatalf("cause %v, want ErrLockLost", context.Cause(held.Context()))
			}
			other := open(t, dbURL)
			next, err := other.Acquire(t.Context(), "reset")
			if err != nil {
				t.Fatal(err)
			}
			if next.Token() <= held.Token() {
				t.Fatalf("token %d after a reset, %d before", next.Token(), held.Token())
			}
			if err := held.Release(context.Background()); !errors.Is(err, locking.ErrLockLost) {
				t.Fatalf("the reset holder's Release = %v, want ErrLockLost", err)
			}
			if err := next.Release(context.Background()); err != nil {
				t.Fatalf("the reset holder's Release freed its successor's lock: %v", err)
			}
		})
	}
}

// TestAdvanceFence: every token after it is greater than the fence, also
// for a name that was never locked.
func TestAdvanceFence(t *testing.T) {
	for _, engine := range engines {
		t.Run(engine, func(t *testing.T) {
			l := open(t, testdb.MigratedURL(t, engine))
			for _, name := range []string{"fresh", "used"} {
				if name == "used" {
					first, err := l.Acquire(t.Context(), name)
					if err != nil {
						t.Fatal(err)
					}
					_ = first.Release(context.Background())
				}
				const fence = 1 << 40
				if err := l.AdvanceFence(t.Context(), name, fence); err != nil {
					t.Fatal(err)
				}
				if err := l.AdvanceFence(t.Context(), name, 5); err != nil { // never back
					t.Fatal(err)
				}
				le, err := l.Acquire(t.Context(), name)
				if err != nil {
					t.Fatal(err)
				}
				if le.Token() <= fence {
					t.Fatalf("%s: token %d after the fence %d", name, le.Token(), int64(fence))
				}
				_ = le.Release(context.Background())
			}
		})
	}
}
