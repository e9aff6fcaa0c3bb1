package dburl_test

import (
	"slices"
	"testing"

	"github.com/flashsale/stock/internal/dburl"
)

func TestAMySQLURLNamesEachNodeOfAClusterWithItsPort(t *testing.T) {
	for _, c := range []struct {
		url   string
		hosts []string
	}{
		{"mysql://root@127.0.0.1/stock", []string{"127.0.0.1:3306"}},
		{"mysql://root@127.0.0.1:3307/stock", []string{"127.0.0.1:3307"}},
		{"mysql://root@a:3307,b,c:3309/stock", []string{"a:3307", "b:3306", "c:3309"}},
	} {
		cfg, hosts, err := dburl.MySQLNodes(c.url)
		if err != nil {
			t.Errorf("%s: %v", c.url, err)
			continue
		}
		if !slices.Equal(hosts, c.hosts) || cfg.Addr != c.hosts[0] || cfg.DBName != "stock" || cfg.User != "root" {
			t.Errorf("%s: hosts %v, Addr %s, database %q, user %q; want hosts %v, Addr the first", c.url, hosts, cfg.Addr, cfg.DBName, cfg.User, c.hosts)
		}
	}
	for _, bad := range []string{"mysql://root@a,,b/stock", "mysql://root@a,b:x/stock", "mysql:///stock"} {
		if _, _, err := dburl.MySQLNodes(bad); err == nil {
			t.Errorf("%s: accepted, want an error", bad)
		}
	}
}
