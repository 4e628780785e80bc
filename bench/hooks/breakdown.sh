#!/usr/bin/env bash
# Where the time of one `session begin` + `session end` pair goes (issue 10,
# "Hooks at the limit"). Differential measurements with hyperfine, each
# variant on its own fresh state root:
#
#   start-up     `agent-state --version` against /bin/true (exec, dynamic loading,
#                relocations, Rust runtime, clap); the binary's relative relocations
#   syncs        each hook against the same hook with fsync/fdatasync made no-ops
#                (LD_PRELOAD of bench/daemon/nosync.c)
#   keeper       `session begin` against a begin whose owner cannot be watched
#                (AGENT_STATE_OWNER_PID of a pid that does not exist: no keeper is
#                started; the lock file is removed instead)
#   the rest     hook (no syncs) - start-up - keeper: config, JSON, journal reads,
#                renames, /proc reads
#
# and the syscalls of each hook (strace -c), if strace is there.
#
#   bench/hooks/breakdown.sh [RUNS]     (default 200 runs per variant; about 1 minute)
#
# Environment: AGENT_STATE_BIN [target/release/agent-state, built unless SKIP_BUILD=1],
# BENCH_TMPDIR [/var/tmp: a real disk, fsync must cost], KEEP=1 keeps the directory.
# No figure is asserted; run it on a quiet machine (it prints the load).

set -euo pipefail

RUNS=${1:-200}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
for tool in hyperfine gcc jq; do
    command -v "$tool" >/dev/null || { echo "breakdown.sh: $tool is required" >&2; exit 69; }
done
if [[ -z ${AGENT_STATE_BIN:-} && ${SKIP_BUILD:-0} != 1 ]]; then
    (cd "$REPO" && cargo build --release)
fi
BIN=${AGENT_STATE_BIN:-$REPO/target/release/agent-state}
[[ -x $BIN ]] || { echo "breakdown.sh: $BIN is missing" >&2; exit 69; }

WORK=$(mktemp -d "${BENCH_TMPDIR:-/var/tmp}/agent-state-breakdown.XXXXXX")
cleanup() { if [[ ${KEEP:-0} == 1 ]]; then echo "kept $WORK"; else rm -rf "$WORK"; fi; }
trap cleanup EXIT
gcc -O2 -shared -fPIC -o "$WORK/nosync.so" "$REPO/bench/daemon/nosync.c"
NOSYNC="LD_PRELOAD=$WORK/nosync.so"

mkroot() { # mkroot NAME: a fresh bootstrapped root; prints its config path
    mkdir -p "$WORK/$1"
    printf 'state_root = "%s"\n\n[[agent]]\nname = "rio"\ndomain = "internet-finance"\n' \
        "$WORK/$1/state" >"$WORK/$1/config.toml"
    "$BIN" --config "$WORK/$1/config.toml" bootstrap >/dev/null
    printf '%s' "$WORK/$1/config.toml"
}
q() { printf '%q' "$1"; }
END_ARGS='--sources-archived 8 --summary "Archived 8 sources" --handoff-notes "Next: compare"'
# The running session's id, read without a process (a builtin `read`).
sid_of() { printf 'read -r sid < %q' "$1"; }

b1=$(mkroot begin) b2=$(mkroot begin-nosync) b3=$(mkroot begin-nokeeper)
e1=$(mkroot end) e2=$(mkroot end-nosync)
# Before each timed begin, the last session is ended (untimed, by id: its
# keeper may still hold the lock for a moment); before each timed end, a
# session is begun (untimed) and its id kept for the end.
end_last() { # end_last CFG
    printf '%s --config %s session end rio --session "$(jq -r .session_id %s)" >/dev/null 2>&1 || true' \
        "$(q "$BIN")" "$(q "$1")" "$(q "$(dirname "$1")/state/rio/session.json")"
}
begin_into() { # begin_into CFG
    printf '%s --config %s session begin rio > %q' "$(q "$BIN")" "$(q "$1")" "$(dirname "$1")/sid"
}
end_cmd() { # end_cmd CFG [ENV]
    printf '%s; %s %s --config %s session end rio --session "$sid" %s >/dev/null' \
        "$(sid_of "$(dirname "$1")/sid")" "${2:-}" "$(q "$BIN")" "$(q "$1")" "$END_ARGS"
}

echo "binary: $BIN; $(nproc) CPUs; state under $(df -T "$WORK" | awk 'NR==2 {print $2 " " $7}'); load $(cut -d' ' -f1-3 /proc/loadavg)"
hyperfine --shell=bash --warmup 5 --runs "$RUNS" --style basic --export-json "$WORK/hooks.json" \
    -n begin --prepare "$(end_last "$b1")" "$(q "$BIN") --config $(q "$b1") session begin rio >/dev/null" \
    -n begin-nosync --prepare "$(end_last "$b2")" "$NOSYNC $(q "$BIN") --config $(q "$b2") session begin rio >/dev/null" \
    -n begin-nokeeper --prepare "$(end_last "$b3")" "AGENT_STATE_OWNER_PID=2147483000 $(q "$BIN") --config $(q "$b3") session begin rio >/dev/null 2>&1" \
    -n end --prepare "$(begin_into "$e1")" "$(end_cmd "$e1")" \
    -n end-nosync --prepare "$(begin_into "$e2")" "$(end_cmd "$e2" "$NOSYNC")" \
    -n version --prepare true "$(q "$BIN") --version >/dev/null" \
    -n true --prepare true "/bin/true" 2> >(grep -v -e Warning -e '^ *$' >&2) >/dev/null
rel=$(readelf -d "$BIN" 2>/dev/null | awk '/RELACOUNT/ {print $3}')

jq -r --arg rel "${rel:-?}" '
  (.results | map({(.command): (.median * 1000)}) | add) as $m
  | def f: . * 100 | round / 100 | tostring;
  ($m.version - $m.true) as $extra
  | ($m.begin - $m["begin-nosync"]) as $bs | ($m.end - $m["end-nosync"]) as $es
  | ($m.begin - $m["begin-nokeeper"]) as $keeper
  | ($m["begin-nosync"] - $m.version - $keeper) as $brest | ($m["end-nosync"] - $m.version) as $erest
  | "medians (ms; hyperfine subtracts the bash -c start-up):",
    "  begin \($m.begin | f), no syncs \($m["begin-nosync"] | f), no keeper \($m["begin-nokeeper"] | f)",
    "  end \($m.end | f), no syncs \($m["end-nosync"] | f)",
    "  agent-state --version \($m.version | f), /bin/true \($m.true | f)",
    "",
    "where a pair goes (ms)            begin    end   pair",
    "  process start (--version)      \($m.version | f)   \($m.version | f)   \(2 * $m.version | f)   of which /bin/true \(2 * $m.true | f), the rest \(2 * $extra | f) (\($rel) relative relocations per start)",
    "  syncs (6 begin, 5 end)         \($bs | f)   \($es | f)   \($bs + $es | f)",
    "  keeper (fork + exec)           \($keeper | f)      -   \($keeper | f)",
    "  the rest                       \($brest | f)   \($erest | f)   \($brest + $erest | f)   config, JSON, journal, renames, /proc",
    "  total                          \($m.begin | f)   \($m.end | f)   \($m.begin + $m.end | f)"
' "$WORK/hooks.json"

if command -v strace >/dev/null; then
    # Without -f: the keeper lives until its owner (this script) exits.
    c=$(mkroot strace)
    strace -c -o "$WORK/begin.strace" "$BIN" --config "$c" session begin rio >/dev/null
    sid=$(jq -r .session_id "$(dirname "$c")/state/rio/session.json")
    strace -c -o "$WORK/end.strace" "$BIN" --config "$c" session end rio --session "$sid" --sources-archived 8 >/dev/null
    echo
    for h in begin end; do
        printf '%-5s syscalls (strace -c): %s in all; most: %s\n' "$h" \
            "$(awk '$NF == "total" {print $4}' "$WORK/$h.strace")" \
            "$(awk 'NF >= 5 && $1 ~ /^[0-9.]+$/ && $NF != "total" {print $4, $NF}' "$WORK/$h.strace" \
                | sort -rn | head -8 | awk '{printf "%s%s %s", (NR > 1 ? ", " : ""), $2, $1}')"
    done
fi
