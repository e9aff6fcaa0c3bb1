#!/usr/bin/env bash
# make unit: every package's tests, with the race detector, in two streams
# at once (make test's time was 42 minutes from a cold cache when one
# package ran at a time; most packages spend their time waiting: for a
# lease to expire, a timeout, a server to start).
#
#   - the packages that load the machine (service processes, bursts, the
#     fault runs, the schedule explorer; LOADED below) one at a time, so
#     that their deadlines and figures are not another load's noise, with
#     them zklock, whose reconnection tests time a dial (under a burst
#     beside it, a dial right after a cut connection timed out: CI);
#   - every other package beside them, two at a time.
#
# Before the streams, every package (test files included) is compiled
# once, two at a time, without linking: with -p 1 the go command compiles
# one package at a time too, and two streams would compile the shared
# dependencies twice. The pinned k6 (lab/cmd/demo's smoke test runs it;
# its first build takes about 4 minutes) is built beside that compilation,
# not beside the tests.
#
# GO and TESTFLAGS come from the Makefile; a stream's failure fails the
# whole, after both have ended.
set -uo pipefail
cd "$(dirname "$0")/.."
GO="${GO:-go}"
read -r -a flags <<<"${TESTFLAGS:--race -count=1 -timeout 20m}"

# In this order: lab/cmd/demo last, by when k6 is built.
LOADED=(./cmd/stock ./internal/sales ./internal/locking/zklock ./lab/explore ./lab/faults ./lab/cmd/demo)

# After the light packages, in their stream: the tests on replicated
# clusters (Patroni, Galera), whose starts and state transfers load the
# machine in bursts; beside the light packages they starved the timing of
# redislock's renewals (CI), beside the loaded ones they only wait.
LATE=(./lab/failover)

loaded_paths=$("$GO" list "${LOADED[@]}") || exit 1
late_paths=$("$GO" list "${LATE[@]}") || exit 1
mapfile -t light < <("$GO" list ./... | grep -vxF "$loaded_paths" | grep -vxF "$late_paths")

# Compiles, links nothing: the build cache keeps every package's archive.
build_flags=()
for f in "${flags[@]}"; do
	[ "$f" = "-race" ] && build_flags+=(-race)
done
(cd loadtest && "$GO" tool -n k6 >/dev/null) &
k6=$!
if ! "$GO" list "${build_flags[@]}" -export -test -deps ./... >/dev/null; then
	echo "unit: compiling the packages and their tests failed" >&2
	kill "$k6" 2>/dev/null
	wait "$k6"
	exit 1
fi
# A k6 that did not build fails the smoke test, which says why.
wait "$k6" || true

"$GO" test "${flags[@]}" -p 1 "${LOADED[@]}" &
loaded=$!
{ "$GO" test "${flags[@]}" -p 2 "${light[@]}"; light_status=$?
  "$GO" test "${flags[@]}" -p 1 "${LATE[@]}" && exit "$light_status"; } &
rest=$!

status=0
wait "$loaded" || status=1
wait "$rest" || status=1
exit "$status"
