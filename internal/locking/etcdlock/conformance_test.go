package etcdlock_test

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/flashsale/stock/internal/locking/etcdlock"
	"github.com/flashsale/stock/internal/locking/locktest"
	"github.com/flashsale/stock/lab/testetcd"
	"github.com/flashsale/stock/lab/testproxy"
)

// testTTL is etcd's smallest lease TTL, one second (the test members'
// election timeout allows it).
const testTTL = time.Second

// proxiedClient is an etcd client that talks to cluster through proxies of
// its own, one per member, closed at t's cleanup.
func proxiedClient(t *testing.T, cluster *testetcd.Cluster) (*clientv3.Client, testproxy.Group) {
	t.Helper()
	var link testproxy.Group
	var eps []string
	for _, ep := range cluster.Endpoints() {
		p := testproxy.Start(t, ep)
		link = append(link, p)
		eps = append(eps, p.Addr)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli, link
}

func TestConformance(t *testing.T) {
	cluster := testetcd.Start(t)
	var restart func(*testing.T)
	if !cluster.External() {
		restart = func(t *testing.T) { cluster.Restart(t) }
	}
	locktest.Run(t, locktest.Backend{
		TTL: testTTL,
		Connect: func(t *testing.T) (locktest.Client, locktest.Link) {
			cli, link := proxiedClient(t, cluster)
			l := etcdlock.New(cli, etcdlock.WithTTL(testTTL))
			return locktest.ClientOf(l.Acquire, l.Close), link
		},
		Restart: restart,
	})
}
