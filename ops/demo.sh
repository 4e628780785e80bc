#!/usr/bin/env bash
# demo.sh — agent-state in two minutes, on this machine, without root, systemd
# or an API key: a fresh state root from config/dev.toml, two messages for rio,
# a completed session of rio (the hooks a session script calls), a timed-out
# session of theseus, then `status` and marcus's mailbox.
#
# Usage: ops/demo.sh
# Environment:
#   BIN         the agent-state program (default: `cargo build --release` and
#               target/release/agent-state)
#   CONFIG      config file (default config/dev.toml); its state_root is the
#               demo's state root (var/dev-state/ for dev.toml)
#   STATE_ROOT  put the state elsewhere: the demo then uses a copy of CONFIG
#               with this state_root (kept beside the root as demo-config.toml)
#
# The state root is removed and re-created on every run; the demo refuses to
# run while a daemon runs on it.

set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CONFIG=${CONFIG:-$REPO/config/dev.toml}
STATE_ROOT=${STATE_ROOT:-}
BIN=${BIN:-}
# The demo starts its own sessions; it must not join someone else's.
unset AGENT_STATE_SESSION_ID AGENT_STATE_CONFIG

bold=""
plain=""
if [[ -t 1 ]]; then
    bold=$'\e[1m'
    plain=$'\e[0m'
fi
step=0
heading() {
    step=$((step + 1))
    printf '\n%s== %d. %s%s\n' "$bold" "$step" "$*" "$plain"
}
note() { printf '   %s\n' "$*"; }
# A word as a reader would type it.
quote() {
    if [[ $1 =~ ^[A-Za-z0-9_./:@%+=,#-]+$ ]]; then
        printf '%s' "$1"
    else
        printf "'%s'" "${1//\'/\'\\\'\'}"
    fi
}
# `as ARGS...`: show `agent-state ARGS...`, then run it with the demo's config.
as() {
    local a
    printf '%s$ agent-state' "$bold"
    for a in "$@"; do
        printf ' %s' "$(quote "$a")"
    done
    printf '%s\n' "$plain"
    "$BIN" --config "$CONFIG" "$@"
}
die() {
    echo "demo.sh: $*" >&2
    exit 1
}

# ---- build ------------------------------------------------------------------
heading "The program"
if [[ -z $BIN ]]; then
    command -v cargo >/dev/null || die "cargo not found: install Rust (https://rustup.rs) or set BIN=/path/to/agent-state"
    note "building with cargo build --release (the first build takes a minute)"
    (cd "$REPO" && cargo build --release -q)
    BIN=$REPO/target/release/agent-state
fi
[[ -x $BIN ]] || die "$BIN is not an executable"
note "$BIN ($("$BIN" --version))"

# ---- where the state goes ----------------------------------------------------
# state_root as the config names it: relative paths are relative to the file.
config_root=$(sed -n 's/^[[:space:]]*state_root[[:space:]]*=[[:space:]]*"\([^"]*\)".*/\1/p' "$CONFIG" | head -n 1)
[[ -n $config_root ]] || die "$CONFIG has no state_root = \"...\" line"
if [[ -n $STATE_ROOT ]]; then
    STATE_ROOT=$(realpath -m -- "$STATE_ROOT")
    demo_config="$(dirname "$STATE_ROOT")/demo-config.toml"
    mkdir -p "$(dirname "$STATE_ROOT")"
    escaped=$(printf '%s' "$STATE_ROOT" | sed 's/[\\|&]/\\&/g')
    sed "s|^\([[:space:]]*state_root[[:space:]]*=[[:space:]]*\)\"[^\"]*\"|\1\"$escaped\"|" "$CONFIG" >"$demo_config"
    CONFIG=$demo_config
else
    case $config_root in
    /*) STATE_ROOT=$(realpath -m -- "$config_root") ;;
    *) STATE_ROOT=$(realpath -m -- "$(dirname "$CONFIG")/$config_root") ;;
    esac
fi
case $STATE_ROOT in
/ | "$HOME" | "$REPO") die "refusing to use $STATE_ROOT as the demo's state root" ;;
esac
if [[ -e $STATE_ROOT && ! -d $STATE_ROOT/.daemon && -n $(ls -A "$STATE_ROOT" 2>/dev/null) ]]; then
    die "$STATE_ROOT is not empty and does not look like a state root (no .daemon/); not removing it"
fi

# A daemon running on the root would be left watching a removed directory
# (and a second one could start on the new root): refuse while one runs.
daemon_lock=$STATE_ROOT/.daemon/lock
if [[ -e $daemon_lock ]]; then
    running=""
    if command -v flock >/dev/null; then
        flock --nonblock --shared "$daemon_lock" true 2>/dev/null || running=yes
    else
        pid=$(sed -n 's/.*"pid"[[:space:]]*:[[:space:]]*\([0-9]*\).*/\1/p' "$STATE_ROOT/.daemon/daemon.json" 2>/dev/null | head -n 1)
        [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null && running=yes
    fi
    if [[ -n $running ]]; then
        die "an agent-state daemon is running on $STATE_ROOT; stop it first (Ctrl-C in its terminal, or kill the pid in $STATE_ROOT/.daemon/daemon.json): the demo removes and re-creates the state root"
    fi
fi

heading "A fresh state root"
note "config: $CONFIG"
note "state:  $STATE_ROOT (removed and re-created)"
rm -rf -- "$STATE_ROOT"
as bootstrap
note "every agent now has report.json, tasks.json, memory.md, journal.jsonl, metrics.json and an inbox/;"
note "marcus is a human: a mailbox only."

# ---- messages -----------------------------------------------------------------
heading "Messages for rio"
note "marcus flags something, high priority (a pipeline or a person would do the same):"
as send --from marcus --to rio --type flag --priority high \
    --subject "Check MetaDAO for AI agent participation" \
    --body "Found evidence that AI agents are trading on Drift. Are any of them in MetaDAO's conditional markets? Alignment implications if automated agents steer futarchic governance." \
    --source-ref "theseus/research-2026-03-31"
note "theseus hands rio a task; a task message also adds a pending task to tasks.json:"
as send --from theseus --to rio --type task \
    --subject "Investigate conditional AMM failures" \
    --body "Three sources on conditional AMM failures need extraction before Friday."
as inbox rio

# ---- a completed session --------------------------------------------------------
today=$(date -u +%Y-%m-%d)
# `session begin` prints the session id. It runs from this shell, not from a
# $(...) subshell: agent-state records its parent process as the session's owner.
id_file=$(mktemp)
trap 'rm -f "$id_file"' EXIT
heading "rio's session begins (the pre-session hook)"
note "a session script (ops/research-session.example.sh) calls this after creating its branch;"
note "it marks rio as researching, journals session_start and claims the inbox messages:"
printf '%s$ agent-state session begin rio --type research ...%s\n' "$bold" "$plain"
"$BIN" --config "$CONFIG" session begin rio --type research --branch "rio/research-$today" \
    --model sonnet --timeout 90m \
    --research-question "How is conditional liquidity being implemented in Solana AMMs?" \
    --disconfirmation-target "Cases where prediction markets failed to aggregate information" \
    --sources-expected 10 >"$id_file"
rio_session=$(<"$id_file")
note "session id: $rio_session"

heading "The prompt rio's agent gets"
note "memory, tasks and the claimed messages, as \`agent-state prompt rio\` prints them:"
echo
"$BIN" --config "$CONFIG" prompt rio | sed 's/^/   | /'

heading "rio's agent works, then the session ends (the post-session hook)"
note "(here the script would run claude -p, commit, push and open a PR; the daemon will"
note " run config/dev.toml's ops/demo-agent.sh instead)"
as session end rio --session "$rio_session" --sources-archived 8 \
    --branch "rio/research-$today" --pr 247 \
    --summary "Completed research session — 8 sources archived on Solana launchpad mechanics" \
    --next-priority "Follow up on conditional AMM thread from @0xfbifemboy" \
    --handoff-notes "Found 3 sources on conditional AMM failures — needs extraction. Also flagged @metaproph3t thread for Theseus (AI governance angle)." \
    --tokens-used 184233 --cost-usd 1.37
note "rio answers marcus:"
as send --from rio --to marcus --type question \
    --subject "MetaDAO: no AI agents found in conditional markets yet" \
    --body "Checked the last 30 days of MetaDAO proposals; no automated participants identified. Want me to keep watching?"
note "rio's report.json, as pipelines read it:"
sed 's/^/   | /' "$STATE_ROOT/rio/report.json"

# ---- a failed session --------------------------------------------------------------
heading "theseus's session times out (the on-error hook)"
note "a session script's exit trap calls \`session fail\` when claude runs past its timeout:"
"$BIN" --config "$CONFIG" session begin theseus --type research \
    --branch "theseus/research-$today" --model sonnet --timeout 90m >"$id_file"
theseus_session=$(<"$id_file")
note "began $theseus_session"
as session fail theseus --session "$theseus_session" --outcome timeout \
    --reason "claude ran past the 90m timeout (timeout exit 124)"

# ---- everyone at a glance ---------------------------------------------------------
heading "Everyone at a glance"
as status

heading "marcus's mailbox"
as inbox marcus

echo
note "The files are plain JSON, JSONL and Markdown under $STATE_ROOT/ — look around,"
note "e.g. cat $STATE_ROOT/rio/journal.jsonl"
