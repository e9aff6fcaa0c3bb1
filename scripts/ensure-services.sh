#!/usr/bin/env bash
# Makes sure PostgreSQL, MariaDB and Redis answer on 127.0.0.1 with the
# access the project expects (postgres/trust, root/empty password), starting
# them — and installing them from Debian's packages — only when they are
# missing. A server that already answers is used as it is. Then creates the
# `stock` database on both engines.
#
# Nothing here stops or restarts a server that runs.
set -euo pipefail

log() { printf 'services: %s\n' "$*" >&2; }

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

pg_ok() { psql "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable&connect_timeout=3" -Atc 'select 1' >/dev/null 2>&1; }
my_ok() { mariadb --protocol=tcp -h 127.0.0.1 -P 3306 -u root --connect-timeout=3 -e 'select 1' >/dev/null 2>&1; }
redis_ok() { [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = PONG ]; }

ensure_postgres() {
  if pg_ok; then return; fi
  if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
    log "installing PostgreSQL"
    apt_install postgresql postgresql-client
  fi
  local version
  version=$(ls /etc/postgresql | sort -V | tail -n 1)
  local conf=/etc/postgresql/$version/main
  # The project's tests connect over TCP as postgres without a password.
  if ! grep -q '^host all all 127.0.0.1/32 trust' "$conf/pg_hba.conf"; then
    sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$conf/pg_hba.conf"
  fi
  log "starting PostgreSQL $version"
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  wait_for pg_ok || { log "PostgreSQL does not answer on 127.0.0.1:5432"; exit 1; }
}

ensure_mariadb() {
  if my_ok; then return; fi
  if ! command -v mariadbd >/dev/null 2>&1; then
    log "installing MariaDB"
    apt_install mariadb-server mariadb-client
  fi
  if ! mariadb-admin --connect-timeout=2 ping >/dev/null 2>&1; then
    log "starting MariaDB"
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
    wait_for mariadb-admin --connect-timeout=2 ping || { log "MariaDB does not start"; exit 1; }
  fi
  if ! my_ok; then
    # A fresh Debian install lets root in only through the unix socket;
    # the project connects over TCP with an empty password.
    log "allowing root@localhost over TCP with an empty password (development server)"
    mariadb -u root -e "ALTER USER root@localhost IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('')" || true
  fi
  wait_for my_ok || { log "MariaDB does not answer on 127.0.0.1:3306 as root"; exit 1; }
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
  wait_for redis_ok || { log "Redis does not answer on 127.0.0.1:6379"; exit 1; }
}

command -v psql >/dev/null 2>&1 || apt_install postgresql-client
command -v mariadb >/dev/null 2>&1 || apt_install mariadb-client
command -v redis-cli >/dev/null 2>&1 || apt_install redis-tools

ensure_postgres
ensure_mariadb
ensure_redis

psql "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable" -Atc "select 1 from pg_database where datname = 'stock'" | grep -q 1 \
  || psql "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable" -qc 'CREATE DATABASE stock'
mariadb --protocol=tcp -h 127.0.0.1 -u root -e 'CREATE DATABASE IF NOT EXISTS stock'
log "PostgreSQL, MariaDB and Redis answer on 127.0.0.1; database stock exists on both"
