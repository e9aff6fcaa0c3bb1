#!/usr/bin/env bash
# A benchmark of two versions in one run: BASE (a git revision) against the
# working tree, alternated round by round so that the machine's noise falls
# on both alike, then compared with benchstat.
#
#   scripts/bench-ab.sh BASE PACKAGE BENCH [ROUNDS]
#   scripts/bench-ab.sh df4836b ./internal/locking/redislock/ 'Contended/cs=.*/locking-' 5
#
# BENCHTIME (default 2s) is passed to -test.benchtime. The raw results stay
# in OUT (default a new temporary directory) as base.txt and head.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: $0 BASE PACKAGE BENCH [ROUNDS]}
pkg=${2:?usage: $0 BASE PACKAGE BENCH [ROUNDS]}
bench=${3:?usage: $0 BASE PACKAGE BENCH [ROUNDS]}
rounds=${4:-5}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
tree=$(mktemp -d)
trap 'git worktree remove --force "$tree" >/dev/null 2>&1 || true' EXIT
git worktree add --detach "$tree" "$base" >/dev/null
(cd "$tree" && go test -c -o "$out/base.test" "$pkg")
go test -c -o "$out/head.test" "$pkg"
: >"$out/base.txt"
: >"$out/head.txt"
dir=$(go list -f '{{.Dir}}' "$pkg")
for round in $(seq "$rounds"); do
  for v in base head; do
    echo "round $round/$rounds: $v" >&2
    (cd "$dir" && "$out/$v.test" -test.run '^$' -test.bench "$bench" -test.count 1 \
      -test.benchtime "${BENCHTIME:-2s}") | tee -a "$out/$v.txt" | grep '^Benchmark' >&2
  done
done
go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da \
  "base=$out/base.txt" "head=$out/head.txt"
echo "raw results: $out" >&2
