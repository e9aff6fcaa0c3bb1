// Package dburl reads a DATABASE_URL into a driver's configuration. It is
// the one place that knows the URL's rules, so that every user of a
// database (the engines' adapters, the lock table, the test helpers and
// tools) reads it the same way without importing an adapter for it.
package dburl

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// MySQLIOTimeout is the driver's readTimeout and writeTimeout unless the
// URL sets them. It must exceed the longest statement: a row-lock wait,
// which internal/mysql keeps to the order's deadline or to 20 s.
const MySQLIOTimeout = 30 * time.Second

// MySQL turns mysql://user:pass@host:port/db?param=value into the driver's
// configuration. Parameters are the driver's DSN parameters (tls, timeout, …).
// Unless the URL says otherwise, times are parsed and query arguments are
// interpolated by the client, which saves a prepare round trip per
// statement; that is safe because the connection's charset is utf8mb4.
//
// With several hosts (mysql://root@h1:3306,h2:3306/stock, the nodes of a
// Galera cluster), Addr is the first; MySQLNodes lists them all.
func MySQL(raw string) (*mysql.Config, error) {
	cfg, _, err := MySQLNodes(raw)
	return cfg, err
}

// MySQLNodes is MySQL and the URL's hosts, each host:port (3306 when the
// URL gives none), in the URL's order.
func MySQLNodes(raw string) (*mysql.Config, []string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("mysql: parse DATABASE_URL: %w", err)
	}
	if u.Scheme != "mysql" {
		return nil, nil, fmt.Errorf("mysql: DATABASE_URL must start with mysql://, not %s://", u.Scheme)
	}
	if u.Host == "" {
		return nil, nil, errors.New("mysql: DATABASE_URL has no host")
	}
	var hosts []string
	for h := range strings.SplitSeq(u.Host, ",") {
		if h == "" {
			return nil, nil, fmt.Errorf("mysql: DATABASE_URL has an empty host in %q", u.Host)
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(strings.Trim(h, "[]"), "3306")
		}
		hosts = append(hosts, h)
	}
	cfg, err := mysqlConfig(u, hosts[0])
	if err != nil {
		return nil, nil, err
	}
	return cfg, hosts, nil
}

// mysqlConfig is the driver's configuration of u's database at host.
func mysqlConfig(u *url.URL, host string) (*mysql.Config, error) {
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" || strings.Contains(db, "/") {
		return nil, errors.New("mysql: DATABASE_URL must name one database, as in mysql://root@127.0.0.1:3306/stock")
	}
	q := u.Query()
	defaults := map[string]string{
		"parseTime": "true", "interpolateParams": "true", "charset": "utf8mb4", "timeout": "5s",
		// database/sql commits and rolls back without a context, so only
		// I/O timeouts bound them (and any call without a deadline) when
		// the server stops answering.
		"readTimeout": MySQLIOTimeout.String(), "writeTimeout": MySQLIOTimeout.String(),
	}
	for k, v := range defaults {
		if !q.Has(k) {
			q.Set(k, v)
		}
	}
	// The driver's own DSN parser handles the parameters; only the user
	// info needs the driver's quoting rules, so it is set afterwards.
	cfg, err := mysql.ParseDSN(fmt.Sprintf("tcp(%s)/%s?%s", host, db, q.Encode()))
	if err != nil {
		return nil, fmt.Errorf("mysql: DATABASE_URL: %w", err)
	}
	if cfg.ClientFoundRows {
		// With CLIENT_FOUND_ROWS the server counts rows an UPDATE matched,
		// not rows it changed: the idempotency insert's no-op update of a
		// key taken by another order would count as inserted, and one key
		// would deduct twice. No other driver parameter changes what
		// RowsAffected means.
		return nil, errors.New("mysql: DATABASE_URL sets clientFoundRows=true, which makes a duplicate idempotency key count as a new order; remove it")
	}
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	return cfg, nil
}
