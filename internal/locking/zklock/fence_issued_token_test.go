package zklock_test

import (
	"math"
	"testing"

	"github.com/flashsale/stock/lab/testzk"
)

// AdvanceFence's promise: a store that refused a token because it saw a
// higher one "from a ZooKeeper whose data was lost and whose zxids began
// again" calls AdvanceFence(highest seen), and every later token is above
// it. The fence base may be as high as MaxInt64/2, and a token adds z<<16
// to it (up to 2^62), so the Locker itself hands out tokens above
// MaxInt64/2: AdvanceFence must accept them, or ("too high") the store
// could never be fenced past them again and would refuse every holder for
// good.
//
// The base could get there without anyone asking for a high fence: the
// store calls AdvanceFence with the highest token it saw (B + z<<16 + i)
// after every fenced-off write, including the refusals the package
// documents as accepted (another process's already-begun batch), even
// though every later token is above it anyway (z grows). Were B set to
// atLeast each time, each call would add about z<<16 = e*2^48 to B for a
// ZooKeeper epoch e, and tokens would pass MaxInt64/2 after about 2^14/e
// fenced-off writes (16,384 at epoch 1, 64 at epoch 256);
// TestAdvanceFenceDoesNotGrowForIssuedTokens pins that the base does not
// grow then.
//
// Schedule: process P on ZooKeeper S1 with base MaxInt64/2 (reached as
// above, or by an AdvanceFence the package allows) holds with token T =
// B + z<<16 > MaxInt64/2; the store records T. S1's data is lost: a fresh
// server S2, zxids from the beginning, no fence node. P' on S2 holds with a
// small token; the store refuses it and calls AdvanceFence(T): it
// succeeds, and the next token is above T.
func TestAdvanceFencePassesAnIssuedToken(t *testing.T) {
	name := uniqueName(t)
	s1 := testzk.StartOwn(t)
	p := newLocker(t, []string{s1.Addr})
	if err := p.AdvanceFence(t.Context(), name, math.MaxInt64/2); err != nil {
		t.Fatalf("AdvanceFence(MaxInt64/2), a fence the package allows: %v", err)
	}
	le := acquire(t, p, t.Context(), name)
	seen := le.Token() // the store's highest token
	release(t, le)
	_ = p.Close()
	s1.Stop()

	s2 := testzk.StartOwn(t) // S1 with its data lost
	p2 := newLocker(t, []string{s2.Addr})
	le = acquire(t, p2, t.Context(), name)
	if le.Token() > seen {
		t.Fatalf("token %d on the fresh server is above %d: no refusal to recover from", le.Token(), seen)
	}
	release(t, le)
	// The store refused that token: it advances the fence past what it saw.
	if err := p2.AdvanceFence(t.Context(), name, seen); err != nil {
		t.Errorf("AdvanceFence(%d), a token this lock handed out: %v", seen, err)
	}
	le = acquire(t, p2, t.Context(), name)
	defer release(t, le)
	if le.Token() <= seen {
		t.Errorf("token %d after AdvanceFence(%d): the store refuses every holder from now on", le.Token(), seen)
	}
}

// A store calls AdvanceFence with the highest token it saw after every
// write it refused, also when every later token is above it anyway: the
// fence base must not grow then, or tokens run out after a few thousand
// refusals.
func TestAdvanceFenceDoesNotGrowForIssuedTokens(t *testing.T) {
	srv := testzk.Start(t)
	name := uniqueName(t)
	l := newLocker(t, []string{srv.Addr})
	fence := func() string {
		t.Helper()
		data, _, err := l.Conn().Get(l.Dir(name) + "/fence")
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	le := acquire(t, l, t.Context(), name)
	release(t, le)
	before := fence()
	for range 20 {
		le = acquire(t, l, t.Context(), name)
		seen := le.Token()
		release(t, le)
		if err := l.AdvanceFence(t.Context(), name, seen); err != nil {
			t.Fatal(err)
		}
	}
	if after := fence(); after != before {
		t.Fatalf("fence base %s after advancing it to tokens already issued, was %s", after, before)
	}
}
