#!/usr/bin/env bash
# The benchmark table of issue 10 in one command: runs what it needs from
# bench/daemon and bench/hooks, then prints one row per figure:
#
#   wake latency, rename -> agent running, p50 / p99      bench/daemon latency (1000 wakes, 100 agents)
#   burst, 100k messages / 100 agents (exactly once)      bench/daemon burst
#   the burst's floor: the same with no daemon          bench/daemon floor (floor.c, 1 and 2 workers)
#   start-up at 10k agents, second start; RSS; SIGHUP     bench/daemon startup 10000
#   wakes after start at 10k agents, p99 vs 100 agents    bench/daemon startup 100 and 10000
#   hook pair session begin + end vs the Python baseline  bench/hooks (200 pairs)
#
#   bench/table.sh                 full sizes: about 10 minutes on 2 cores, plus the quiet waits
#   QUICK=1 bench/table.sh         small sizes (100 wakes, 10k messages, 1000 agents, 20 pairs)
#
# Environment:
#   AGENT_STATE_BIN   the binary to measure [target/release/agent-state, built first]
#   SKIP_BUILD=1      do not run `cargo build --release`
#   OUT_DIR           keep the JSON results here [a temp directory, removed at the end]
#   QUIET_WAIT        passed to bench/daemon/run.sh [120]: wait for an idle machine before each run
# Everything else bench/daemon/run.sh and bench/hooks/run.sh read (LAT_WAKES, BURST_PER_AGENT,
# STARTUP_AGENTS, PAIRS, BENCH_TMPDIR, ...) is passed through.
#
# Exit status: 0, or 1 if a benchmark failed (its reason is printed above the table).

set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
QUICK=${QUICK:-0}
export QUICK

if [[ -z ${AGENT_STATE_BIN:-} && ${SKIP_BUILD:-0} != 1 ]]; then
    printf '\n== cargo build --release\n' >&2
    (cd "$REPO" && cargo build --release)
fi
export AGENT_STATE_BIN=${AGENT_STATE_BIN:-$REPO/target/release/agent-state}
export SKIP_BUILD=1
[[ -x $AGENT_STATE_BIN ]] || { echo "table.sh: $AGENT_STATE_BIN is missing (cargo build --release)" >&2; exit 69; }

if [[ -n ${OUT_DIR:-} ]]; then
    mkdir -p "$OUT_DIR"
    out=$OUT_DIR
else
    out=$(mktemp -d "${TMPDIR:-/tmp}/agent-state-table.XXXXXX")
    trap 'rm -rf "$out"' EXIT
fi

failed=0
if [[ $QUICK == 1 ]]; then big=1000; else big=10000; fi
BENCHES=latency,burst,floor,startup STARTUP_AGENTS=${STARTUP_AGENTS:-"100 $big"} \
    STARTUP_WAKES_AFTER=${STARTUP_WAKES_AFTER:-50} OUT_DIR=$out/daemon \
    "$HERE/daemon/run.sh" || failed=1
OUT=$out/hooks.json "$HERE/hooks/run.sh" || failed=1

printf '\n== the table\n'
cat "$out/daemon/build.txt" 2>/dev/null || true
echo "load after the run: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
shopt -s nullglob
python3 "$HERE/daemon/bench.py" table "$out"/daemon/*.json "$out/hooks.json"
((failed == 0)) || echo "table.sh: a benchmark FAILED (see above); its rows say (not run)" >&2
exit "$failed"
