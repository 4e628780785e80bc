#!/usr/bin/env bash
# Benchmark: one `session begin` + `session end` pair of the release binary
# against the same on-disk updates done by a Python 3 script (baseline.py) and a
# jq + mv shell script (baseline-jq.sh). See README.md.
#
#   bench/hooks/run.sh [PAIRS]          (default 200 timed pairs per implementation)
#   QUICK=1 bench/hooks/run.sh          a smoke run: 20 pairs in 2 rounds after 2 warm-up pairs
#
# Environment:
#   WARMUP=10            untimed pairs before the timed ones (per implementation)
#   ROUNDS=5             the pairs are split into rounds, the order of the implementations
#                        rotating each round
#   PYTHON=/usr/bin/python3
#                        interpreter the Python baseline runs on (default: /usr/bin/python3
#                        if present, else python3 from PATH, pyenv shims resolved)
#   PYTHON_VENV=1        run it from a fresh `venv --without-pip` of $PYTHON, so that
#                        .pth files installed into the host's site-packages (here: a
#                        sandbox CA hook importing certifi at every start) are not
#                        timed; PYTHON_VENV=0 uses $PYTHON as it is
#   BENCH_TMPDIR=/tmp    where the state roots go (must be a real disk for fsync to count)
#   KEEP=1               keep the temp directory
#   SKIP_BUILD=1         do not run cargo build
#   AGENT_STATE_BIN=PATH time this binary instead of target/release/agent-state (nothing is built)
#   OUT=PATH             also write the medians (ms) and the ratios to Rust as JSON to PATH
#   STEP_TIMEOUT=600     a step (one hyperfine round, one checked pair) not done after this many
#                        seconds fails the run: nothing can hang
#
# Exit status: 0, or 1 if a baseline's files are not equivalent to the Rust ones.

set -euo pipefail

QUICK=${QUICK:-0}
if [[ $QUICK == 1 ]]; then
    PAIRS=${1:-${PAIRS:-20}}
    WARMUP=${WARMUP:-2}
    ROUNDS=${ROUNDS:-2}
fi
PAIRS=${1:-${PAIRS:-200}}
WARMUP=${WARMUP:-10}
STEP_TIMEOUT=${STEP_TIMEOUT:-600}
[[ $PAIRS =~ ^[1-9][0-9]*$ && $WARMUP =~ ^[0-9]+$ ]] || { echo "usage: $0 [PAIRS]" >&2; exit 64; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BIN=${AGENT_STATE_BIN:-$REPO/target/release/agent-state}

say() { printf '\n== %s\n' "$*"; }
# bounded WHAT CMD...: run CMD, but fail the whole run with a clear message if it
# takes longer than STEP_TIMEOUT seconds (a hook blocked on a lock, a stuck disk).
bounded() {
    local what=$1 rc=0
    shift
    timeout --kill-after=10 "$STEP_TIMEOUT" "$@" || rc=$?
    if ((rc == 124 || rc == 137)); then
        echo "run.sh: FAILED: $what did not complete within STEP_TIMEOUT=${STEP_TIMEOUT}s" >&2
        exit 1
    fi
    return "$rc"
}

# ---- tools ---------------------------------------------------------------------

missing=()
for tool in hyperfine jq flock; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if ((${#missing[@]})); then
    pkgs=()
    for t in "${missing[@]}"; do [[ $t == flock ]] && pkgs+=(util-linux) || pkgs+=("$t"); done
    say "installing ${pkgs[*]}"
    SUDO=''
    [[ $(id -u) == 0 ]] || SUDO=sudo
    $SUDO apt-get install -y "${pkgs[@]}" >/dev/null ||
        { $SUDO apt-get update >/dev/null && $SUDO apt-get install -y "${pkgs[@]}" >/dev/null; }
fi
for tool in hyperfine jq flock sync mv tail timeout; do
    command -v "$tool" >/dev/null || { echo "run.sh: $tool is required" >&2; exit 69; }
done

if [[ ${SKIP_BUILD:-0} != 1 && -z ${AGENT_STATE_BIN:-} ]]; then
    command -v cargo >/dev/null || { echo "run.sh: cargo is required (or SKIP_BUILD=1)" >&2; exit 69; }
    say "cargo build --release"
    (cd "$REPO" && cargo build --release)
fi
[[ -x $BIN ]] || { echo "run.sh: $BIN is missing" >&2; exit 69; }

WORK=$(mktemp -d "${BENCH_TMPDIR:-${TMPDIR:-/tmp}}/agent-state-bench.XXXXXX")
cleanup() { if [[ ${KEEP:-0} == 1 ]]; then echo "kept $WORK"; else rm -rf "$WORK"; fi; }
trap cleanup EXIT

# Python: the real interpreter (not a pyenv shim script), in a clean venv.
if [[ -z ${PYTHON-} ]]; then
    if [[ -x /usr/bin/python3 ]]; then PYTHON=/usr/bin/python3; else PYTHON=python3; fi
fi
PY=$("$PYTHON" -c 'import sys; print(sys.executable)')
if [[ ${PYTHON_VENV:-1} == 1 ]]; then
    if "$PY" -m venv --without-pip "$WORK/venv" 2>/dev/null; then
        PY=$WORK/venv/bin/python3
    else
        echo "run.sh: warning: cannot make a venv of $PY; timing it as it is" >&2
    fi
fi
# `python3 baseline.py` compiles the script at every start (a main script gets no
# cached bytecode); the python-pyc row runs the same code precompiled, as an
# installed tool (entry-point stub + cached module) would: Python's best case.
PYC=$WORK/baseline.pyc
NOSYNC_SO=$WORK/nosync.so
if ! { command -v gcc >/dev/null && gcc -O2 -shared -fPIC -o "$NOSYNC_SO" "$REPO/bench/daemon/nosync.c"; }; then
    echo "run.sh: warning: no gcc: the pair's floor (its syncs) is not measured" >&2
    NOSYNC_SO=
fi
"$PY" -c 'import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)' \
    "$HERE/baseline.py" "$PYC"

# ---- state roots -----------------------------------------------------------------

mkroot() { # mkroot NAME → prints the config path of a freshly bootstrapped root
    local dir=$WORK/$1
    mkdir -p "$dir"
    cat >"$dir/config.toml" <<EOF
state_root = "$dir/state"

[[agent]]
name = "rio"
domain = "internet-finance"
EOF
    "$BIN" --config "$dir/config.toml" bootstrap >/dev/null
    printf '%s\n' "$dir/config.toml"
}

SUMMARY='Archived 8 sources on MetaDAO futarchy markets'
HANDOFF='Next: compare the 2024 proposal outcomes with the market prices'
END_ARGS=(--sources-archived 8 --summary "$SUMMARY" --handoff-notes "$HANDOFF")

# A shell command line for one begin + end pair of implementation $1 on config $2.
pair_cmd() {
    local impl=$1 cfg=$2 prog
    case $impl in
        rust) prog=$(printf '%q' "$BIN") ;;
        python) prog="$(printf '%q' "$PY") $(printf '%q' "$HERE/baseline.py")" ;;
        python-pyc) prog="$(printf '%q' "$PY") $(printf '%q' "$PYC")" ;;
        jq) prog="bash $(printf '%q' "$HERE/baseline-jq.sh")" ;;
        # The Rust pair with every fsync/fdatasync a no-op: the pair minus this is
        # what the syncs cost, in the same rounds (the pair's floor, below).
        rust-nosync) prog="LD_PRELOAD=$(printf '%q' "$NOSYNC_SO") $(printf '%q' "$BIN")" ;;
    esac
    printf '%s --config %q session begin rio >/dev/null && %s --config %q session end rio' \
        "$prog" "$cfg" "$prog" "$cfg"
    printf ' %q' "${END_ARGS[@]}"
    printf ' >/dev/null'
}

# ---- equivalence check -------------------------------------------------------------

# Values that differ run to run (times, ids, pids) are replaced; everything else,
# keys and key order included, must match the Rust output. Numbers are compared
# as numbers (jq 1.6 prints 8.0 as 8).
NORM='def volatile: ["ts", "updated_at", "started_at", "ended_at", "session_id", "id",
  "current_session", "counted_session", "owner_pid", "owner_start", "duration_seconds"];
walk(if type == "object"
     then with_entries(if (.key as $k | volatile | index($k)) != null and .value != null
                       then .value = "<varies>" else . end)
     else . end)'

snapshot() { # snapshot STATE_DIR → a normalised text dump of the agent's files
    local d=$1/rio f
    for f in session report metrics; do
        echo "--- $f.json (keys in file order)"
        jq "$NORM" "$d/$f.json"
    done
    echo "--- .daemon/counters.json (instance ids)"
    jq "$NORM" "$1/.daemon/counters.json"
    echo "--- journal.jsonl ($(wc -l <"$d/journal.jsonl") lines)"
    while IFS= read -r line; do jq -c "$NORM" <<<"$line"; done <"$d/journal.jsonl"
    echo "--- modes"
    stat -c '%a %n' "$d"/{session,report,metrics}.json "$d/journal.jsonl" "$d/.lock" \
        "$1/.daemon" "$1/.daemon"/counters.{json,lock} | sed "s#$1/##"
    echo "--- leftovers"
    find "$d" "$1/.daemon" -name '.*.tmp' | sed "s#$1/##"
    find "$d/inbox/.claimed" -mindepth 1 | sed "s#$1/##"
    find "$d/sessions" -name '*.owner' 2>/dev/null | sed "s#$1/##"
    echo "--- sessions/ (owner locks): $(stat -c '%a' "$d/sessions" 2>/dev/null || echo absent)"
}

mismatch=0
say "equivalence: 2 pairs on fresh roots, files compared with Rust's"
for impl in rust python python-pyc jq; do
    cfg=$(mkroot "check-$impl")
    for _ in 1 2; do bounded "a $impl pair" bash -c "$(pair_cmd "$impl" "$cfg")"; done
    snapshot "$WORK/check-$impl/state" >"$WORK/check-$impl.txt"
done
for impl in python python-pyc jq; do
    if diff -u "$WORK/check-rust.txt" "$WORK/check-$impl.txt" >"$WORK/check-$impl.diff"; then
        echo "$impl: same files as rust (session.json, report.json, metrics.json, counters.json, journal.jsonl, modes)"
    else
        mismatch=1
        echo "$impl: MISMATCH with rust:"
        cat "$WORK/check-$impl.diff"
    fi
done

# The same durable work: fsync / fdatasync / successful renames / flock per pair
# (strace -f over the whole pair, child processes included).
say "equivalence: syscalls of one pair (strace -f)"
if command -v strace >/dev/null; then
    printf '%-11s %6s %10s %8s %6s %8s\n' impl fsync fdatasync renames flock execve
    for impl in rust python python-pyc jq; do
        cfg=$(mkroot "strace-$impl")
        bounded "a $impl pair under strace" strace -f -qq -o "$WORK/strace-$impl.txt" \
            -e trace=fsync,fdatasync,rename,renameat,renameat2,flock,execve \
            bash -c "$(pair_cmd "$impl" "$cfg")"
        t=$WORK/strace-$impl.txt
        profile="$(grep -c 'fsync(' "$t") $(grep -c 'fdatasync(' "$t") $(grep -cE 'rename.*= 0$' "$t") $(grep -cE 'flock\(.*LOCK_EX' "$t")"
        read -r a b c d <<<"$profile"
        printf '%-11s %6s %10s %8s %6s %8s\n' "$impl" "$a" "$b" "$c" "$d" "$(grep -cE 'execve\(.*= 0$' "$t")"
        [[ $impl == rust ]] && rust_profile=$profile
        if [[ $profile != "$rust_profile" ]]; then
            mismatch=1
            echo "MISMATCH: $impl does not do the same fsync/fdatasync/rename/flock calls as rust"
        fi
    done
else
    echo "(strace not installed: skipped)"
fi

# ---- timing ------------------------------------------------------------------------

# HISTORY=N: each timed root's journal starts with N finished sessions spread
# over the last 30 days (the same lines for every implementation): the cost of
# a long history (`end` recomputes the rolling 30-day window from the journal).
prefill() { # prefill CONFIG
    local journal
    journal=$(dirname "$1")/state/rio/journal.jsonl
    "$PY" - "$journal" "$HISTORY" <<'PY'
import datetime, json, sys
path, n = sys.argv[1], int(sys.argv[2])
now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
with open(path, "a") as f:
    for i in range(n):
        t = now - datetime.timedelta(seconds=(n - i) * 30 * 86400 // (n + 1))
        ts = t.strftime("%Y-%m-%dT%H:%M:%SZ")
        sid = f"history-{i:05d}"
        f.write(json.dumps({"ts": ts, "event": "session_start", "session_id": sid, "type": "research"}, separators=(",", ":")) + "\n")
        f.write(json.dumps({"ts": ts, "event": "session_end", "session_id": sid, "outcome": "completed",
                            "sources_archived": 3, "summary": "Archived 3 sources", "duration_seconds": 600},
                           separators=(",", ":")) + "\n")
PY
}
HISTORY=${HISTORY:-0}
IMPLS=(rust python python-pyc jq)
[[ -n $NOSYNC_SO ]] && IMPLS+=(rust-nosync)
for impl in "${IMPLS[@]}"; do
    declare "CFG_${impl//-/_}=$(mkroot "time-$impl")"
    cfg_var=CFG_${impl//-/_}
    ((HISTORY > 0)) && prefill "${!cfg_var}"
done
((HISTORY > 0)) && echo "history: $HISTORY finished sessions over the last 30 days in each timed root's journal"
# The disk's fsync latency drifts (a VM's virtual disk, other tenants), so the
# implementations are not timed one after the other: the pairs are split into
# ROUNDS hyperfine runs, the order rotating each round, and the times merged.
ROUNDS=${ROUNDS:-5}
((ROUNDS > PAIRS)) && ROUNDS=$PAIRS
say "timing: $PAIRS pairs per implementation in $ROUNDS rounds, after $WARMUP warm-up pairs (hyperfine)"
echo "python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"
echo "jq: $(jq --version); cores: $(nproc); state under $(df -T "$WORK" | awk 'NR==2 {print $2 " " $7}')"
for ((round = 0; round < ROUNDS; round++)); do
    runs=$((PAIRS / ROUNDS + (round < PAIRS % ROUNDS ? 1 : 0)))
    warm=$((round == 0 ? WARMUP : 2))
    args=()
    for ((i = 0; i < ${#IMPLS[@]}; i++)); do
        impl=${IMPLS[(i + round) % ${#IMPLS[@]}]}
        cfg_var=CFG_${impl//-/_}
        args+=(-n "$impl" "$(pair_cmd "$impl" "${!cfg_var}")")
    done
    echo "-- round $((round + 1))/$ROUNDS: $runs pairs each (+$warm warm-up)"
    bounded "timing round $((round + 1))" hyperfine --shell=bash --warmup "$warm" --runs "$runs" --style "${HYPERFINE_STYLE:-basic}" \
        --export-json "$WORK/round-$round.json" "${args[@]}"
done
# user/system: hyperfine's means per round (the shell and the hooks, not the
# detached owner keeper), merged weighted by the round's runs.
jq -s '{results: ([.[].results[]] | group_by(.command)
                  | map({command: .[0].command, times: [.[].times[]],
                         cpu: ((map((.user + .system) * (.times | length)) | add)
                               / (map(.times | length) | add))}))}' \
    "$WORK"/round-*.json >"$WORK/pairs.json"

FLOOR_RUNS=$((PAIRS < 100 ? PAIRS : 100))
say "start-up floor: two bare process starts, no state touched ($FLOOR_RUNS runs)"
bounded "the start-up floor" hyperfine --shell=bash --warmup 5 --runs "$FLOOR_RUNS" --style basic \
    --export-json "$WORK/floor.json" \
    -n "rust: 2x agent-state --version" "$(printf '%q' "$BIN") --version >/dev/null && $(printf '%q' "$BIN") --version >/dev/null" \
    -n "python: 2x python3 -c pass" "$(printf '%q' "$PY") -c pass && $(printf '%q' "$PY") -c pass" \
    -n "jq: 2x bash + 10x jq -n 1" "for _ in 1 2; do bash -c :; done; for _ in 1 2 3 4 5 6 7 8 9 10; do jq -n 1 >/dev/null; done"

# ---- after the run: the three timed roots must agree too -----------------------------

say "after the run: timed roots compared (journal length, metrics.json, instance counter)"
for impl in rust python python-pyc jq; do
    d=$WORK/time-$impl/state/rio
    printf '%-10s journal lines: %s  metrics: %s  counters: %s\n' "$impl" "$(wc -l <"$d/journal.jsonl")" \
        "$(jq -c '{total: .lifetime.sessions_total, sources: .lifetime.sources_archived, rolling_30d: .rolling_30d}' "$d/metrics.json")" \
        "$(jq -c . "$d/../.daemon/counters.json")" \
        | tee -a "$WORK/after.txt"
done
if [[ $(sed 's/^[a-z-]* *//' "$WORK/after.txt" | sort -u | wc -l) != 1 ]]; then
    mismatch=1
    echo "MISMATCH: the timed roots differ"
fi

# ---- results -------------------------------------------------------------------------

say "results: wall time per begin+end pair, all rounds (ms; hyperfine subtracts the bash -c start-up)"
STATS='def pct($p): sort | .[((length * $p) | ceil) - 1];
  def median: sort | if length % 2 == 1 then .[(length - 1) / 2]
                     else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  [.results[] | {name: .command, median: (.times | median * 1000),
                 mean: (.times | add / length * 1000), p90: (.times | pct(0.9) * 1000), cpu: (.cpu * 1000),
                 min: (.times | min * 1000), n: (.times | length)}]
  | sort_by(["rust", "rust-nosync", "python", "python-pyc", "jq"] as $o | .name as $n | $o | index($n))'
jq -r "$STATS"' | (["implementation", "median", "mean", "p90", "min", "cpu(mean)", "runs"] | @tsv),
  (.[] | [.name, (.median, .mean, .p90, .min, .cpu | . * 100 | round / 100 | tostring), (.n | tostring)] | @tsv)' \
    "$WORK/pairs.json" | column -t -s $'\t'
echo
jq -r "$STATS"' | (map({(.name): .}) | add) as $r
  | ["python", "python-pyc", "jq"][] as $b
  | "\($b)/rust: median \($r[$b].median / $r.rust.median * 100 | round / 100)x, mean \($r[$b].mean / $r.rust.mean * 100 | round / 100)x, p90 \($r[$b].p90 / $r.rust.p90 * 100 | round / 100)x"' \
    "$WORK/pairs.json"
echo
echo "start-up floor (ms, median):"
jq -r '.results[] | "  \(.command): \(.median * 1000 * 100 | round / 100)"' "$WORK/floor.json"
# The pair's floor (issue 21): two starts of the binary + what its syncs cost
# (the pair minus the same pair with no-op syncs), both measured in this run.
jq -r --slurpfile f "$WORK/floor.json" "$STATS"' | (map({(.name): .}) | add) as $r
  | ($f[0].results[0].median * 1000) as $starts
  | if $r["rust-nosync"] then ($r.rust.median - $r["rust-nosync"].median) as $syncs
      | "the pair'"'"'s floor: two starts \($starts * 100 | round / 100) + the syncs \($syncs * 100 | round / 100) = \(($starts + $syncs) * 100 | round / 100) ms; pair / floor \($r.rust.median / ($starts + $syncs) * 100 | round / 100)x (target <= 1.3x)"
    else "the pair'"'"'s floor: not measured (no gcc for nosync.so)" end' "$WORK/pairs.json"
if [[ -n ${OUT:-} ]]; then
    jq "$STATS"' | (map({(.name): .}) | add) as $r
      | {pairs: $pairs, equivalent: ($mismatch == 0),
         median_ms: ($r | map_values(.median)), p90_ms: ($r | map_values(.p90)),
         ratio_median: {python: ($r.python.median / $r.rust.median),
                        "python-pyc": ($r["python-pyc"].median / $r.rust.median),
                        jq: ($r.jq.median / $r.rust.median)},
         cpu_ms: ($r | map_values(.cpu)),
         syncs_ms: (if $r["rust-nosync"] then $r.rust.median - $r["rust-nosync"].median else null end),
         floor_median_ms: ($f[0].results | map({(.command): (.median * 1000)}) | add)}' \
        --argjson pairs "$PAIRS" --argjson mismatch "$mismatch" --slurpfile f "$WORK/floor.json" \
        "$WORK/pairs.json" >"$OUT"
fi

if ((mismatch)); then
    echo
    echo "run.sh: a baseline's files differ from the Rust hooks' (see above)" >&2
    exit 1
fi
