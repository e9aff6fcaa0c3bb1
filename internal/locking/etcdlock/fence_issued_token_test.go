package etcdlock_test

import (
	"context"
	"math"
	"testing"

	"github.com/flashsale/stock/lab/testetcd"
)

// AdvanceFence's promise: a store that saw a token "from an etcd whose data
// was lost (its revisions began again)" calls AdvanceFence(highest seen),
// and every later token is above it. The fence base may be MaxInt64/2 and
// a token adds R<<16 to it, so the Locker itself hands out tokens above
// MaxInt64/2: AdvanceFence must accept any token the lock handed out, or
// once the store has seen one, a loss of etcd's data could never be fenced
// past again.
//
// Schedule: P on etcd E1 with fence base MaxInt64/2 holds with token T =
// base + R<<16; the store records T. E1's data is lost (a fresh E2). P' on
// E2 holds with a small token, refused; AdvanceFence(T) succeeds and the
// next token is above T.
func TestAdvanceFencePassesAnIssuedToken(t *testing.T) {
	e1 := testetcd.Start(t)
	if e1.External() {
		t.Skip("needs an etcd of its own, stopped to stand for the lost one")
	}
	p := newLocker(t, e1.Client(t))
	if err := p.AdvanceFence(t.Context(), "k", math.MaxInt64/2); err != nil {
		t.Fatalf("AdvanceFence(MaxInt64/2), a fence the package allows: %v", err)
	}
	le, err := p.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	seen := le.Token() // the store's highest token
	if err := le.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	_ = p.Close()
	e1.Stop()

	e2 := testetcd.Start(t) // E1 with its data lost
	p2 := newLocker(t, e2.Client(t))
	le, err = p2.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if le.Token() > seen {
		t.Fatalf("token %d on the fresh etcd is above %d: no refusal to recover from", le.Token(), seen)
	}
	if err := le.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := p2.AdvanceFence(t.Context(), "k", seen); err != nil {
		t.Errorf("AdvanceFence(%d), a token this lock handed out: %v", seen, err)
	}
	le, err = p2.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(context.Background())
	if le.Token() <= seen {
		t.Errorf("token %d after AdvanceFence(%d): the store refuses every holder from now on", le.Token(), seen)
	}
}
