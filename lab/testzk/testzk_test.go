package testzk_test

import (
	"io"
	"log"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/flashsale/stock/lab/testzk"
)

func connect(t *testing.T, addrs ...string) *zk.Conn {
	t.Helper()
	c, _, err := zk.Connect(addrs, time.Second, zk.WithLogger(log.New(io.Discard, "", 0)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestRestartKeepsData(t *testing.T) {
	srv := testzk.StartOwn(t)
	c := connect(t, srv.Addr)
	if _, err := c.Create("/kept", []byte("x"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	_, before, err := c.Get("/kept")
	if err != nil {
		t.Fatal(err)
	}
	srv.Restart(t)
	// The client reconnects by itself; a Set is sent once it has.
	st, err := c.Set("/kept", []byte("y"), -1)
	for err == zk.ErrConnectionClosed || err == zk.ErrNoServer {
		st, err = c.Set("/kept", []byte("y"), -1)
	}
	if err != nil {
		t.Fatal(err)
	}
	if st.Mzxid <= before.Mzxid {
		t.Fatalf("zxid %d after the restart, %d before", st.Mzxid, before.Mzxid)
	}
	if st.Czxid != before.Czxid {
		t.Fatal("the node was created anew: the data did not survive the restart")
	}
}

func TestEnsembleSurvivesALeader(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three JVMs")
	}
	e := testzk.StartEnsemble(t, 3)
	c := connect(t, e.Addrs()...)
	if _, err := c.Create("/e", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	leader := e.Leader()
	if leader < 0 {
		t.Fatal("no leader")
	}
	e.Kill(leader)
	deadline := time.Now().Add(30 * time.Second)
	var err error
	for time.Now().Before(deadline) { // a retry loop on the client's own errors, bounded
		if _, err = c.Set("/e", []byte("after"), -1); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("no write after the leader was killed: %v", err)
	}
	if err := e.Start(leader); err != nil {
		t.Fatal(err)
	}
}
