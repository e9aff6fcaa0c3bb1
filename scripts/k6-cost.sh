#!/usr/bin/env bash
# k6's own CPU per request, for the ceiling script (healthz.js) and the
# sale (flashsale.js), alternated ROUNDS times against a running service:
# on a machine where k6 shares the cores with the service, what k6 spends
# on each order is taken from the figure being measured.
#
#   BASE_URLS=http://127.0.0.1:18080 ADMIN_TOKEN=... scripts/k6-cost.sh
#
# Each sale run puts REQUESTS units on sale under a new SKU (flashsale.js),
# so every order is a 201 and the service does its full work; the sold-out
# run puts one unit on sale, so every order but one is a 409 sold_out
# (after the first, answered by the instance's mark: SOLD_OUT_TTL). With
# SERVICE_PIDS (the instances' PIDs, space-separated) it also prints their
# CPU per request. The last column is the whole machine's CPU per request
# (/proc/stat, every process: k6, the service, Redis, the database and
# whatever else runs), so what is neither k6 nor the service shows as the
# difference. Nothing else is started or stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${BASE_URLS:?set BASE_URLS to the service instance(s), comma-separated}"
: "${ADMIN_TOKEN:?set ADMIN_TOKEN to the admin token of the service}"
ROUNDS=${ROUNDS:-3}
REQUESTS=${REQUESTS:-30000}
SERVICE_PIDS=${SERVICE_PIDS:-}
k6=$(cd loadtest && go tool -n k6)
ticks=$(getconf CLK_TCK)

# service_cpu: the CPU seconds the SERVICE_PIDS have used so far.
service_cpu() {
  local total=0 pid
  for pid in $SERVICE_PIDS; do
    # Fields 14 and 15 of /proc/PID/stat (after the command in parentheses).
    total=$((total + $(sed 's/.*) //' "/proc/$pid/stat" | awk '{print $12 + $13}')))
  done
  awk -v t="$total" -v hz="$ticks" 'BEGIN {print t / hz}'
}
# machine_cpu: the CPU seconds all processes have used so far (the "cpu"
# line of /proc/stat: every state but idle and iowait).
machine_cpu() {
  awk -v hz="$ticks" '$1 == "cpu" {print ($2 + $3 + $4 + $7 + $8 + $9) / hz; exit}' /proc/stat
}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# run NAME SCRIPT STOCK: one k6 run; prints "NAME requests cpu-seconds".
run() {
  local name=$1 script=$2 stock=$3 sku="k6-cost-$RANDOM$RANDOM"
  local TIMEFORMAT='%U %S' # bash's time: the child's user and system CPU
  local before machine_before
  before=$(service_cpu)
  machine_before=$(machine_cpu)
  { time (cd loadtest && "$k6" run -q \
    -e BASE_URLS="$BASE_URLS" -e ADMIN_TOKEN="$ADMIN_TOKEN" -e SKU="$sku" \
    -e STOCK="$stock" -e BUYERS="$REQUESTS" -e VUS=64 -e DURATION=5s \
    -e SUMMARY_JSON="$out/summary.json" "$script" >"$out/stdout" 2>&1) ; } 2>"$out/time" || {
    cat "$out/stdout" >&2
    exit 1
  }
  local requests cpu
  requests=$(sed -n 's/^requests: \([0-9]*\).*/\1/p' "$out/stdout")
  cpu=$(awk '{print $1 + $2}' "$out/time")
  echo "$name $requests $cpu $(awk -v a="$before" -v b="$(service_cpu)" 'BEGIN {print b - a}')" \
    "$(awk -v a="$machine_before" -v b="$(machine_cpu)" 'BEGIN {print b - a}')"
}

printf '%-13s %9s %10s %12s %12s %14s %14s\n' script requests k6-cpu-s k6-µs/req service-cpu-s service-µs/req machine-µs/req
for _ in $(seq "$ROUNDS"); do
  for what in "healthz healthz.js 1" "sale flashsale.js $REQUESTS" "sold-out flashsale.js 1"; do
    # shellcheck disable=SC2086 # three words on purpose
    run $what | awk '{printf "%-13s %9d %10.2f %12.0f %12.2f %14.0f %14.0f\n", $1, $2, $3, 1e6 * $3 / $2, $4, 1e6 * $4 / $2, 1e6 * $5 / $2}'
  done
done
