#!/usr/bin/env bash
# Daemon benchmarks: wake latency, a 100,000-message burst, start-up time and
# RSS at 100 and 10,000 agents, and an idle daemon's CPU and wake-ups.
# See bench/daemon/README.md for the method and the figures.
#
#   bench/daemon/run.sh                 everything, full sizes (about 6 minutes on 2 cores, plus the build)
#   QUICK=1 bench/daemon/run.sh         everything, small sizes (about 2 minutes)
#   BENCHES=latency,burst bench/daemon/run.sh
#
# BENCHES (comma-separated; default all):
#   latency   sequential wakes: message renamed in -> fake agent's main()
#   nosync    the same with an LD_PRELOAD shim that makes fsync/fdatasync no-ops
#   slowsync  the same with a shim that adds SLOWSYNC_US to every fsync/fdatasync (a slower disk)
#   strace    the same under `strace -f -c`: syscalls per wake (its latencies are not figures)
#   flood     the same while another agent's inbox holds FLOOD_FILES wake requests and as many
#             junk files (what any member of the inbox group can do), twice: made before the
#             daemon starts (steady: the inbox holds them all when the wakes start), and made
#             while the wakes are measured (during). Compare with `latency` at the same LAT_WAKES
#   paired    the flood's figure with the machine's noise cancelled: two daemons of the same
#             binary at once on two state roots, identical configs, one with FLOOD_FILES wake
#             requests + as many junk files in another agent's inbox before it starts; wakes of
#             a clean agent alternate between them, each waited to its end. Per phase p50/p99
#             of each and flooded/clean with a 95% bootstrap interval over the pairs.
#             PAIRED_PIN=1 adds a run with the clean daemon on CPU 0 and the flooded one on CPU 1
#   web       wake latency with WEB_CLIENTS event streams open on the web view ([web], issue 25)
#             vs none: two daemons at once, wakes alternating as in `paired`; checks that every
#             stream saw every session start and end exactly once. Target: p99 within ±10%
#   wakecli   `agent-state wake AGENT --wait` wall time
#   burst     BURST_AGENTS x BURST_PER_AGENT messages renamed in at once; checks exactly-once
#   floor     the same burst with no daemon: only the protocol's own system calls (floor.c), 1 and 2 workers
#   startup   first and second start, RSS, at each of STARTUP_AGENTS
#   idle      CPU and context switches of an idle daemon; strace of the same daemon
#
# Environment (defaults in brackets; QUICK=1 changes those marked *):
#   LAT_WAKES [1000*]  LAT_AGENTS [100]  LAT_GAP [0.02 s between wakes]
#   SLOWSYNC_WAKES [300*]  SLOWSYNC_US [1000]
#   WEB_WAKES [1000*, per daemon]  WEB_CLIENTS [20]  WEB_IDLE [10 s*; idle CPU with the streams open]
#   PAIRED_WAKES [LAT_WAKES, per daemon]  PAIRED_PIN [0]  PAIRED_REPS [1; repetitions of each]
#   STRACE_WAKES [100*]  WAKECLI_WAKES [200*]  FLOOD_FILES [100000*]  FLOOD_PERF [0; 1 = perf record
#                      --call-graph dwarf of the daemon during the flood's wakes, perf-latency.data]
#   BURST_AGENTS [100]  BURST_PER_AGENT [1000*]  BURST_MAX_CONCURRENT [4]
#   BURST_TIMEOUT [600 s]  BURST_PERF [0; 1 = perf record -g, 2 = --call-graph dwarf]
#   BURST_STRACE [0; 1 = strace -f -c, calls per message; 2 = every call in strace.txt]
#   STARTUP_AGENTS ["100 10000"*]  STARTUP_WAKES_AFTER [50*]
#   IDLE_AGENTS [100]  IDLE_SECONDS [60*]  IDLE_STRACE [1]
#   QUIET_WAIT [120]   before each benchmark, wait up to this many seconds for the machine
#                      to be idle (3 s under 20% CPU); 0 = do not wait. Busy figures are recorded.
#   BENCH_MAX_SECONDS [3600, QUICK 600]  a benchmark not done after this long fails (and its
#                      daemon is stopped): no benchmark can hang
#   START_TIMEOUT [900, QUICK 120]  seconds to wait for READY=1 at a start or a SIGHUP
#   BENCH_TMPDIR [/var/tmp]  where the state roots go; must be a real disk (fsync must cost)
#   KEEP [0]           1 keeps the work directory (roots, daemon logs, perf data, raw JSON)
#   OUT_DIR            copy the results (one JSON per benchmark, build.txt) here at the end
#   SKIP_BUILD [0]     1 skips `cargo build --release`
#   AGENT_STATE_BIN    [target/release/agent-state]  another binary (then nothing is built)
#
# Exit status: 0, or 1 if a benchmark failed (could not complete within its bounds, or an
# exactly-once check failed: the burst's, and the latency runs' over every message they sent).

set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BIN=${AGENT_STATE_BIN:-$REPO/target/release/agent-state}
QUICK=${QUICK:-0}
q() { if [[ $QUICK == 1 ]]; then echo "$2"; else echo "$1"; fi; }

BENCHES=${BENCHES:-latency,nosync,slowsync,strace,flood,paired,web,wakecli,burst,floor,startup,idle}
WEB_WAKES=${WEB_WAKES:-$(q 1000 100)}
WEB_CLIENTS=${WEB_CLIENTS:-20}
WEB_IDLE=${WEB_IDLE:-$(q 10 3)}
LAT_WAKES=${LAT_WAKES:-$(q 1000 100)}
LAT_AGENTS=${LAT_AGENTS:-100}
LAT_GAP=${LAT_GAP:-0.02}
STRACE_WAKES=${STRACE_WAKES:-$(q 100 20)}
SLOWSYNC_WAKES=${SLOWSYNC_WAKES:-$(q 300 50)}
SLOWSYNC_US=${SLOWSYNC_US:-1000}
WAKECLI_WAKES=${WAKECLI_WAKES:-$(q 200 20)}
FLOOD_FILES=${FLOOD_FILES:-$(q 100000 20000)}
PAIRED_WAKES=${PAIRED_WAKES:-$LAT_WAKES}
PAIRED_PIN=${PAIRED_PIN:-0}
PAIRED_REPS=${PAIRED_REPS:-1}
BURST_AGENTS=${BURST_AGENTS:-100}
BURST_PER_AGENT=${BURST_PER_AGENT:-$(q 1000 100)}
BURST_MAX_CONCURRENT=${BURST_MAX_CONCURRENT:-4}
BURST_TIMEOUT=${BURST_TIMEOUT:-600}
BURST_PERF=${BURST_PERF:-0}
BURST_STRACE=${BURST_STRACE:-0}
FLOOR_WORKERS=${FLOOR_WORKERS:-1,2}
STARTUP_AGENTS=${STARTUP_AGENTS:-$(q "100 10000" "100 1000")}
STARTUP_WAKES_AFTER=${STARTUP_WAKES_AFTER:-$(q 50 10)}
IDLE_AGENTS=${IDLE_AGENTS:-100}
IDLE_SECONDS=${IDLE_SECONDS:-$(q 60 10)}
IDLE_STRACE=${IDLE_STRACE:-1}
BENCH_TMPDIR=${BENCH_TMPDIR:-/var/tmp}
QUIET_WAIT=${QUIET_WAIT:-120}
BENCH_MAX_SECONDS=${BENCH_MAX_SECONDS:-$(q 3600 600)}
START_TIMEOUT=${START_TIMEOUT:-$(q 900 120)}

has() { [[ ,$BENCHES, == *,$1,* ]]; }
say() { printf '\n== %s\n' "$*" >&2; }

for tool in python3 gcc; do
    command -v "$tool" >/dev/null || { echo "run.sh: $tool is required" >&2; exit 69; }
done
if has strace || { has idle && [[ $IDLE_STRACE == 1 ]]; }; then
    command -v strace >/dev/null || { echo "run.sh: strace is required for 'strace' and IDLE_STRACE=1 (apt-get install strace)" >&2; exit 69; }
fi
if [[ $BURST_STRACE != 0 ]]; then
    command -v strace >/dev/null || { echo "run.sh: BURST_STRACE needs strace" >&2; exit 69; }
fi
if [[ $BURST_PERF != 0 ]]; then
    command -v perf >/dev/null || { echo "run.sh: BURST_PERF needs perf" >&2; exit 69; }
fi

fstype=$(stat -f -c %T "$BENCH_TMPDIR")
if [[ $fstype == tmpfs || $fstype == ramfs ]]; then
    echo "run.sh: BENCH_TMPDIR=$BENCH_TMPDIR is $fstype; use a directory on a real disk (fsync must cost what it costs)" >&2
    exit 64
fi

if [[ ${SKIP_BUILD:-0} != 1 && -z ${AGENT_STATE_BIN:-} ]]; then
    say "cargo build --release"
    (cd "$REPO" && cargo build --release)
fi
[[ -x $BIN ]] || { echo "run.sh: $BIN is missing (cargo build --release)" >&2; exit 69; }

WORK=$(mktemp -d "$BENCH_TMPDIR/agent-state-daemon-bench.XXXXXX")
PIDS=$WORK/pids
: >"$PIDS"
DRIVER_PID=
cleanup() {
    local rc=$?
    if [[ -n $DRIVER_PID ]]; then
        kill -TERM "$DRIVER_PID" 2>/dev/null || true
        wait "$DRIVER_PID" 2>/dev/null || true
    fi
    # Stop only the daemons this run started, by pid, and only if that pid is
    # still one of ours (its command line names a config under $WORK).
    while read -r pid; do
        [[ -n $pid && -r /proc/$pid/cmdline ]] || continue
        if tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF "$WORK/"; then
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done <"$PIDS"
    if [[ -n ${OUT_DIR:-} && -d $WORK/results ]]; then
        mkdir -p "$OUT_DIR" && cp "$WORK"/results/* "$OUT_DIR"/ 2>/dev/null || true
    fi
    if [[ ${KEEP:-0} == 1 ]]; then
        echo "kept $WORK" >&2
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "compiling the fake agent and the no-fsync shim (gcc)"
FAKE=$WORK/fake_agent
if gcc -O2 -static -o "$FAKE" "$HERE/fake_agent.c" 2>/dev/null; then
    echo "fake_agent: static" >&2
else
    gcc -O2 -o "$FAKE" "$HERE/fake_agent.c"
    echo "fake_agent: dynamic (no static libc here)" >&2
fi
gcc -O2 -shared -fPIC -o "$WORK/nosync.so" "$HERE/nosync.c"
gcc -O2 -o "$WORK/floor_c" "$HERE/floor.c"
gcc -O2 -shared -fPIC -o "$WORK/slowsync.so" "$HERE/slowsync.c" -ldl

RESULTS=$WORK/results
mkdir -p "$RESULTS"
DRIVER=(python3 "$HERE/bench.py" --bin "$BIN" --fake-agent "$FAKE" --work "$WORK" --pids "$PIDS" --quiet-wait "$QUIET_WAIT"
    --max-seconds "$BENCH_MAX_SECONDS" --start-timeout "$START_TIMEOUT")
{
    echo "binary: $BIN ($(stat -c '%y' "$BIN" | cut -d. -f1), sha256 $(sha256sum "$BIN" | cut -c1-16))"
    if [[ -n ${AGENT_STATE_BIN:-} ]]; then
        echo "source: ${BIN_SOURCE:-AGENT_STATE_BIN, not built here (BIN_SOURCE=... names its commit)}"
    else
        echo "source: $(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo '?')$(cd "$REPO" && git status --porcelain -- src Cargo.toml Cargo.lock 2>/dev/null | grep -q . && echo ' + uncommitted changes in src/')"
    fi
    echo "machine: $(nproc) CPUs, $(uname -r), $BENCH_TMPDIR on $fstype ($(df -P "$BENCH_TMPDIR" | awk 'NR==2 {print $1}')), load $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$RESULTS/build.txt"
cat "$RESULTS/build.txt" >&2
failed=0
run() { # NAME ARGS...: one benchmark; its JSON goes to $RESULTS/NAME.json
    local name=$1
    shift
    say "$name: ${*}"
    # In the background and waited for, so that a signal to run.sh runs the
    # trap at once instead of after the benchmark.
    "${DRIVER[@]}" "$@" --out "$RESULTS/$name.json" >/dev/null &
    DRIVER_PID=$!
    if ! wait "$DRIVER_PID"; then
        echo "run.sh: benchmark $name FAILED (its reason is above; KEEP=1 keeps its logs)" >&2
        failed=1
    fi
    DRIVER_PID=
}

has latency && run latency latency --wakes "$LAT_WAKES" --agents "$LAT_AGENTS" --gap "$LAT_GAP"
has nosync && run latency-nosync latency --name latency-nosync --wakes "$LAT_WAKES" --agents "$LAT_AGENTS" --gap "$LAT_GAP" --preload "$WORK/nosync.so"
has slowsync && run latency-slowsync latency --name latency-slowsync --label "slowsync +${SLOWSYNC_US}us per sync" --wakes "$SLOWSYNC_WAKES" --agents "$LAT_AGENTS" --gap "$LAT_GAP" --preload "$WORK/slowsync.so" --env "SLOWSYNC_US=$SLOWSYNC_US"
has strace && run latency-strace latency --name latency-strace --wakes "$STRACE_WAKES" --warmup 0 --agents "$LAT_AGENTS" --gap "$LAT_GAP" --strace-counts 1
if has flood; then
    run latency-flood-steady latency --name latency-flood-steady --label "flood, steady: another inbox holds ${FLOOD_FILES} wake requests + ${FLOOD_FILES} junk files" --wakes "$LAT_WAKES" --agents "$LAT_AGENTS" --gap "$LAT_GAP" --flood "$FLOOD_FILES" --flood-when before --warmup 0 --perf "${FLOOD_PERF:-0}"
    run latency-flood latency --name latency-flood --label "flood, during: ${FLOOD_FILES} wake requests + ${FLOOD_FILES} junk files made in another inbox" --wakes "$LAT_WAKES" --agents "$LAT_AGENTS" --gap "$LAT_GAP" --flood "$FLOOD_FILES" --flood-when during --perf "${FLOOD_PERF:-0}"
fi
if has paired; then
    for rep in $(seq 1 "$PAIRED_REPS"); do
        run "paired-$rep" paired --name "paired-$rep" --warmup 0 --wakes "$PAIRED_WAKES" --agents "$LAT_AGENTS" --gap "$LAT_GAP" --flood "$FLOOD_FILES"
        if [[ $PAIRED_PIN == 1 ]]; then
            run "paired-pinned-$rep" paired --name "paired-pinned-$rep" --pin 1 --warmup 0 --wakes "$PAIRED_WAKES" --agents "$LAT_AGENTS" --gap "$LAT_GAP" --flood "$FLOOD_FILES"
        fi
    done
fi
has web && run web web --wakes "$WEB_WAKES" --clients "$WEB_CLIENTS" --idle "$WEB_IDLE" --agents "$LAT_AGENTS" --gap "$LAT_GAP"
has wakecli && run wakecli wakecli --wakes "$WAKECLI_WAKES" --agents "$LAT_AGENTS"
has burst && run burst burst --agents "$BURST_AGENTS" --per-agent "$BURST_PER_AGENT" --max-concurrent "$BURST_MAX_CONCURRENT" --timeout "$BURST_TIMEOUT" --perf "$BURST_PERF" --strace "$BURST_STRACE"
has floor && run floor floor --agents "$BURST_AGENTS" --per-agent "$BURST_PER_AGENT" --workers "$FLOOR_WORKERS" --floor "$WORK/floor_c" --timeout "$BURST_TIMEOUT"
if has startup; then
    for n in $STARTUP_AGENTS; do
        run "startup-$n" startup --agents "$n" --wakes-after "$STARTUP_WAKES_AFTER" --perf "${STARTUP_PERF:-0}"
    done
fi
has idle && run idle idle --agents "$IDLE_AGENTS" --seconds "$IDLE_SECONDS" --strace "$IDLE_STRACE"

say "summary"
shopt -s nullglob
cat "$RESULTS/build.txt"
python3 "$HERE/bench.py" summary "$RESULTS"/*.json
echo
echo "raw results: $RESULTS/*.json$([[ ${KEEP:-0} == 1 ]] || echo ' (removed on exit; KEEP=1 keeps them)')"
exit "$failed"
