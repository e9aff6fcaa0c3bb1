#!/usr/bin/env bash
# make demo: bring up what is missing, build, and run the comparison of the
# anti-oversell strategies (lab/cmd/demo), which writes reports/<timestamp>/ and
# points reports/latest at it.
#
#   make demo                 # about 65 minutes on 2 cores (first k6 build: +4),
#                             # the catalog of 10,000 SKUs, the lifecycle and
#                             # the failover section (about 20) included
#   DEMO_QUICK=1 make demo    # about 12 minutes (CATALOG_SKUS=0, LIFECYCLE=0
#                             # and FAILOVER=0 leave sections out; docs/demo.md)
#   PUBLISH=1 make demo       # and copy the report to docs/results/<timestamp>/
#
# Servers: PostgreSQL and MariaDB/MySQL that already answer on 127.0.0.1 are
# used as they are. Otherwise, where a Docker engine answers, the missing
# ones come from docker-compose.yml; failing that, scripts/ensure-services.sh
# installs and starts them from Debian's packages. The Redis servers of the
# lock strategies are started by the runner itself (five redis-servers on
# free ports, stopped at the end), or by docker compose when redis-server is
# not installed. Likewise etcd-lock gets a private single-member etcd and
# zk-lock a private standalone ZooKeeper, on free loopback ports, unless
# ETCD_ENDPOINTS or ZK_SERVERS name servers of your own; a strategy whose
# server cannot start is skipped with a note in the report. Every setting
# is an environment variable: see
# lab/cmd/demo/config.go. TEST_POSTGRES_URL and TEST_MYSQL_URL, as for the tests,
# name servers that need credentials; the demo then uses their stock
# database.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'demo: %s\n' "$*" >&2; }

# port_open HOST PORT: something listens there.
port_open() { timeout 2 bash -c "</dev/tcp/$1/$2" 2>/dev/null; }

pg_ok() {
  if command -v psql >/dev/null 2>&1; then
    psql "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable&connect_timeout=3" -Atc 'select 1' >/dev/null 2>&1
  else
    port_open 127.0.0.1 5432
  fi
}
my_ok() {
  if command -v mariadb >/dev/null 2>&1; then
    mariadb --protocol=tcp -h 127.0.0.1 -P 3306 -u root --connect-timeout=3 -e 'select 1' >/dev/null 2>&1
  else
    port_open 127.0.0.1 3306
  fi
}
docker_ok() { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; }
# docker-compose.yml requires ADMIN_TOKEN (the stock service has no default
# token) and compose checks it for every service it starts. The demo starts
# backends only from it, so any token of 16+ characters will do.
if [ -z "${ADMIN_TOKEN:-}" ]; then
  ADMIN_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  export ADMIN_TOKEN
fi

missing=()
pg_ok || missing+=(postgres)
my_ok || missing+=(mysql)
if [ -n "${TEST_POSTGRES_URL:-}${TEST_MYSQL_URL:-}" ]; then
  # Servers named by the tests' variables (lab/cmd/demo runs on them too):
  # ensure-services.sh checks that they answer, starts only what is local
  # and missing, and creates the stock database on them.
  bash scripts/ensure-services.sh
  missing=()
elif [ ${#missing[@]} -gt 0 ] && docker_ok; then
  log "starting ${missing[*]} with docker compose"
  docker compose up -d --wait "${missing[@]}"
elif [ ${#missing[@]} -gt 0 ] || ! command -v redis-server >/dev/null 2>&1; then
  # Installs (as root) and starts what is missing, creates the databases.
  bash scripts/ensure-services.sh
elif { [ -z "${ETCD_ENDPOINTS:-}" ] && ! command -v etcd >/dev/null 2>&1; } \
  || { [ -z "${ZK_SERVERS:-}" ] && [ ! -e /usr/share/java/zookeeper.jar ]; }; then
  # The etcd and ZooKeeper the runner starts for etcd-lock and zk-lock.
  bash scripts/ensure-services.sh
fi
if ! command -v redis-server >/dev/null 2>&1 && [ -z "${REDIS_ADDRS:-}" ] && docker_ok; then
  log "redis-server is not installed: starting five Redis servers with docker compose"
  docker compose up -d --wait redis1 redis2 redis3 redis4 redis5
  export REDIS_ADDRS=127.0.0.1:6379,127.0.0.1:6380,127.0.0.1:6381,127.0.0.1:6382,127.0.0.1:6383
fi
# The stock database on both engines (docker compose creates it; a server
# that was already running may not have it).
if [ -z "${TEST_POSTGRES_URL:-}${TEST_MYSQL_URL:-}" ] && command -v psql >/dev/null 2>&1 && pg_ok; then
  psql "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable" -Atc "select 1 from pg_database where datname = 'stock'" | grep -q 1 \
    || psql "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable" -qc 'CREATE DATABASE stock'
fi
if [ -z "${TEST_POSTGRES_URL:-}${TEST_MYSQL_URL:-}" ] && command -v mariadb >/dev/null 2>&1 && my_ok; then
  mariadb --protocol=tcp -h 127.0.0.1 -u root -e 'CREATE DATABASE IF NOT EXISTS stock'
fi

log "building bin/stock"
go build -o bin/stock ./cmd/stock
log "building the pinned k6 (loadtest/go.mod): cached after the first time, which takes about 4 minutes"
(cd loadtest && go tool -n k6 >/dev/null)
# STOCK_BIN: the runner uses the binary built above instead of rebuilding.
STOCK_BIN=bin/stock go run ./lab/cmd/demo "$@"

# PUBLISH=1: publish the report to docs/results/<its timestamp>/, to be
# committed: its data (results.json.gz, the k6 figures included) and its
# pages (index.html, report.md, choosing.md) rendered there from it, so that
# they link only what the copy holds (the runs' folders stay in reports/);
# the README's table quotes the latest of them. `go run ./lab/cmd/demo render`
# draws a folder's pages again from its data.
if [ "${PUBLISH:-0}" = 1 ]; then
  run=$(basename "$(readlink -f reports/latest)")
  dest="docs/results/$run"
  go run ./lab/cmd/demo publish reports/latest "$dest"
  log "published reports/$run to $dest"
fi
