// Package failover holds the tests of the service on replicated servers
// (docs/replicated.md): PostgreSQL under Patroni (lab/testpatroni) and a
// MariaDB Galera cluster (lab/testgalera), every safe strategy through
// several nodes, and the failovers that must lose no order answered 201.
// Redis under Sentinel is tested beside the reservation
// (internal/reservation/sentinel_failover_test.go). Its own package, so
// that its waits for clusters and failovers run beside the packages that
// load the machine (scripts/unit.sh), not after them.
package failover
