package main

import (
	"syscall"

	"github.com/flashsale/stock/internal/connlimit"
)

// maxConnsCeiling bounds the default HTTP_MAX_CONNS however many
// descriptors the process may open: past ten thousand connections an
// instance holds more buyers than it can take orders for in an order's
// deadline, and each idle connection still costs a goroutine and its
// buffers. More buyers belong on more instances.
const maxConnsCeiling = 10000

// otherFiles is the descriptors kept for what is neither an HTTP connection
// nor the database pool: the Redis, etcd and ZooKeeper clients' pools, the
// listener, the runtime's poller, standard streams, DNS lookups.
const otherFiles = 512

// openFileLimit is how many descriptors the process may open: the soft
// RLIMIT_NOFILE, which Go raised to the hard limit at start (package os,
// on Linux). Unreadable, it is taken for 1024, the usual soft limit.
func openFileLimit() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 1024
	}
	return int(min(lim.Cur, 1<<30)) // RLIM_INFINITY is the largest uint64
}

// descriptorReserve is how many of nofile descriptors are not for HTTP
// connections under the cap: the database pool, the operator headroom over
// the cap and otherFiles, or half the limit when it is too small for those
// (a limit of 1024 leaves HTTP 512).
func descriptorReserve(nofile, dbMaxConns int) int {
	return min(dbMaxConns+connlimit.DefaultHeadroom+otherFiles, nofile/2)
}

// defaultHTTPMaxConns is HTTP_MAX_CONNS's default: what nofile leaves after
// descriptorReserve, at most maxConnsCeiling. With the usual limits of a
// container (1,048,576) or a systemd service (524,288) that is 10,000; with
// 1024 it is 512.
func defaultHTTPMaxConns(nofile, dbMaxConns int) int {
	return max(1, min(maxConnsCeiling, nofile-descriptorReserve(nofile, dbMaxConns)))
}
