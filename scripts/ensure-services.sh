#!/usr/bin/env bash
# Makes sure PostgreSQL, MariaDB and Redis answer on 127.0.0.1, starting
# them — and installing them from Debian's packages — only when they are
# missing. A server that already answers is used as it is. Then creates the
# `stock` database on both engines.
#
# The servers are the ones TEST_POSTGRES_URL and TEST_MYSQL_URL name (the
# tests and make demo read the same variables), by default postgres without a
# password and root with an empty one on 127.0.0.1.
#
# Access is configured (trust in pg_hba.conf, an empty root password) only
# on a server this script installed itself, which it records in
# /var/lib/stock-dev/. A server that was there before and asks for
# credentials is never touched: the script stops and names the variable to
# set. Nothing here stops or restarts a server that runs. etcd, ZooKeeper
# and Chromium (for the report's browser test) are installed, not started.
set -euo pipefail

log() { printf 'services: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# STOCK_DEV_MARKERS and STOCK_DEV_PG_ETC exist for the script's own test.
MARKERS=${STOCK_DEV_MARKERS:-/var/lib/stock-dev}
PG_ETC=${STOCK_DEV_PG_ETC:-/etc/postgresql}
PG_URL=${TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
MY_URL=${TEST_MYSQL_URL:-mysql://root@127.0.0.1:3306/mysql}

# installed_by_us NAME: this script installed that server (see mark).
installed_by_us() { [ -e "$MARKERS/installed-$1" ]; }
mark() { mkdir -p "$MARKERS" && echo "installed by scripts/ensure-services.sh on $(date -u +%FT%TZ)" >"$MARKERS/installed-$1"; }

# wait_for CMD...: retry a readiness check for up to 30 s.
wait_for() {
  for _ in $(seq 1 60); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  return 1
}

apt_updated=""
apt_install() {
  if [ "$(id -u)" != 0 ]; then
    log "need root to install $*; install them yourself or run as root"; return 1
  fi
  if [ -z "$apt_updated" ]; then apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# The parts of MY_URL (mysql://user[:password]@host[:port]/db), for the
# mariadb client; the password goes through MYSQL_PWD, not the command line.
[[ $MY_URL =~ ^mysql://([^:@/]*)(:([^@/]*))?@([^:/?]+)(:([0-9]+))?(/|$) ]] \
  || die "TEST_MYSQL_URL must look like mysql://user:password@host:port/db"
MY_USER=${BASH_REMATCH[1]}
MY_PWD=$(printf '%b' "${BASH_REMATCH[3]//%/\\x}")
MY_HOST=${BASH_REMATCH[4]}
MY_PORT=${BASH_REMATCH[6]:-3306}
my() { MYSQL_PWD=$MY_PWD mariadb --protocol=tcp -h "$MY_HOST" -P "$MY_PORT" -u "$MY_USER" --connect-timeout=3 "$@"; }

pg_ok() { PGCONNECT_TIMEOUT=3 psql "$PG_URL" -Atc 'select 1' >/dev/null 2>&1; }
my_ok() { my -e 'select 1' >/dev/null 2>&1; }
redis_ok() { [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = PONG ]; }

ensure_postgres() {
  if pg_ok; then return; fi
  [ -z "${TEST_POSTGRES_URL:-}" ] || die "PostgreSQL does not answer at TEST_POSTGRES_URL; start it or correct the variable"
  if ! ls "$PG_ETC"/*/main >/dev/null 2>&1; then
    log "installing PostgreSQL"
    apt_install postgresql postgresql-client
    mark postgres
  fi
  local version
  version=$(ls "$PG_ETC" | sort -V | tail -n 1)
  local conf=$PG_ETC/$version/main
  local running=""
  if pg_isready -q -h 127.0.0.1 -p 5432 -t 3; then running=1; fi
  if ! installed_by_us postgres; then
    # Someone else's server: start it if it is stopped, never change it.
    [ -z "$running" ] || die "PostgreSQL on 127.0.0.1:5432 refuses postgres without a password and was not installed by this script: set TEST_POSTGRES_URL=postgres://USER:PASSWORD@127.0.0.1:5432/postgres?sslmode=disable"
  elif ! grep -q '^host all all 127.0.0.1/32 trust' "$conf/pg_hba.conf"; then
    # Ours: the project's tests connect over TCP as postgres without a
    # password.
    sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$conf/pg_hba.conf"
    if [ -n "$running" ]; then pg_ctlcluster --skip-systemctl-redirect "$version" main reload; fi
  fi
  if [ -z "$running" ]; then
    log "starting PostgreSQL $version"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  fi
  if ! wait_for pg_ok; then
    installed_by_us postgres || die "PostgreSQL on 127.0.0.1:5432 refuses postgres without a password and was not installed by this script: set TEST_POSTGRES_URL=postgres://USER:PASSWORD@127.0.0.1:5432/postgres?sslmode=disable"
    die "PostgreSQL does not answer on 127.0.0.1:5432"
  fi
}

ensure_mariadb() {
  if my_ok; then return; fi
  [ -z "${TEST_MYSQL_URL:-}" ] || die "MySQL/MariaDB does not answer at TEST_MYSQL_URL; start it or correct the variable"
  if ! command -v mariadbd >/dev/null 2>&1; then
    log "installing MariaDB"
    apt_install mariadb-server mariadb-client
    mark mariadb
  fi
  if ! mariadb-admin --connect-timeout=2 ping >/dev/null 2>&1; then
    log "starting MariaDB"
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
    wait_for mariadb-admin --connect-timeout=2 ping || die "MariaDB does not start"
  fi
  if ! my_ok; then
    installed_by_us mariadb || die "MariaDB on 127.0.0.1:3306 refuses root without a password and was not installed by this script: set TEST_MYSQL_URL=mysql://USER:PASSWORD@127.0.0.1:3306/mysql"
    # Ours: a fresh Debian install lets root in only through the unix
    # socket; the project connects over TCP with an empty password.
    log "allowing root@localhost over TCP with an empty password (the development server this script installed)"
    mariadb -u root -e "ALTER USER root@localhost IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('')" || true
  fi
  wait_for my_ok || die "MariaDB does not answer on $MY_HOST:$MY_PORT as $MY_USER"
}

ensure_redis() {
  if redis_ok; then return; fi
  if ! command -v redis-server >/dev/null 2>&1; then
    log "installing Redis"
    apt_install redis-server redis-tools
  fi
  log "starting Redis on 127.0.0.1:6379"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_for redis_ok || die "Redis does not answer on 127.0.0.1:6379"
}

command -v psql >/dev/null 2>&1 || apt_install postgresql-client
command -v mariadb >/dev/null 2>&1 || apt_install mariadb-client
command -v redis-cli >/dev/null 2>&1 || apt_install redis-tools

ensure_postgres
ensure_mariadb
ensure_redis

# The coordination services of etcd-lock and zk-lock, from Debian's
# packages. The tests start private servers from these binaries on free
# ports (lab/testetcd, lab/testzk); nothing is started here.
command -v etcd >/dev/null 2>&1 || { log "installing etcd"; apt_install etcd-server etcd-client; }
[ -e /usr/share/java/zookeeper.jar ] || { log "installing ZooKeeper"; apt_install zookeeperd; }
# The replicated servers of issue 39 (docs/replicated.md), for the tests'
# private clusters (lab/testpatroni, lab/testgalera): Patroni over
# PostgreSQL and etcd; Galera with MariaDB, its state transfer by rsync.
command -v patroni >/dev/null 2>&1 || { log "installing Patroni"; apt_install patroni; }
[ -e /usr/lib/galera/libgalera_smm.so ] || { log "installing Galera"; apt_install galera-4; }
command -v rsync >/dev/null 2>&1 || { log "installing rsync"; apt_install rsync; }
# Chromium, headless, for the report's browser test (lab/report,
# TestReportReadsInABrowser): Debian's package, never a browser a test tool
# downloads. The test starts it itself, on file:// pages only.
command -v chromium >/dev/null 2>&1 || { log "installing Chromium"; apt_install chromium chromium-driver; }

psql "$PG_URL" -Atc "select 1 from pg_database where datname = 'stock'" | grep -q 1 \
  || psql "$PG_URL" -qc 'CREATE DATABASE stock'
my -e 'CREATE DATABASE IF NOT EXISTS stock'
log "PostgreSQL, MariaDB and Redis answer; database stock exists on both; etcd, ZooKeeper, Patroni, Galera and Chromium are installed"
