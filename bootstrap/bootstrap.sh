#!/usr/bin/env bash
# bootstrap.sh — prepare a server for agent-state (run as root; safe to rerun).
#
#   1. the system group (default: the config's `group`, else teleo) whose
#      members may write agents' inboxes
#   2. the system user agent-state (no login shell, home /var/lib/agent-state, as
#      the unit's StateDirectory= and sysusers.d give it: the agents' CLI
#      credentials, e.g. ~/.claude, live there)
#   3. the config in /etc/agent-state/config.toml, if there is none yet
#      (an existing config is never overwritten)
#   4. the state root, then `agent-state --config CONFIG bootstrap`, which
#      creates every configured agent's directory and initial state and never
#      overwrites a file
#   5. ownership and modes: everything agent-state:GROUP; the root, .shared and
#      agent directories 0755; .daemon 0750; inbox/ and inbox/.tmp 3770
#      (group-writable; setgid so delivered files keep the group; sticky so
#      a member can rename or remove only its own entries), the daemon's
#      processed/, rejected/, .claimed/ (and its session directories) 2750
#      (the group reads, only the user writes), messages 0640; .lock,
#      .daemon/lock and .daemon/counters.lock 0600 (only the user and root
#      may hold them);
#      state files (report, tasks, session, metrics .json, memory.md,
#      journal.jsonl, identity/rules/prompt .md) 0644
#
# Every step says what it does; with --dry-run nothing is changed and the
# steps say what they would do.
#
# Usage: bootstrap.sh [--dry-run] [--config FILE] [--source-config FILE]
#                     [--state-root DIR] [--bin PATH] [--group NAME] [--user NAME]
# Environment (the flags win): CONFIG, SOURCE_CONFIG, STATE_ROOT, BIN, GROUP,
# AGENT_USER, DRY_RUN=1.
#
#   CONFIG         the installed config   (default /etc/agent-state/config.toml)
#   SOURCE_CONFIG  what is installed there when it is missing
#                  (default: config/agent-state.toml beside this script's directory)
#   STATE_ROOT     default: the config's state_root. When the config is installed
#                  by this run, its state_root is set to STATE_ROOT; an existing
#                  config that names another root is an error.
#   BIN            the agent-state program (default /usr/bin/agent-state, as the
#                  unit runs it, else /usr/local/bin/agent-state, else on PATH)
#   AGENT_HOME     the user's home (default /var/lib/agent-state)
#
# Exit status: 0 done, 64 usage, 69 no program, 77 not root, 78 config problem, else a step failed.

set -euo pipefail

readonly SCRIPT=${0##*/}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

CONFIG=${CONFIG:-/etc/agent-state/config.toml}
SOURCE_CONFIG=${SOURCE_CONFIG:-$HERE/../config/agent-state.toml}
STATE_ROOT=${STATE_ROOT:-}
BIN=${BIN:-}
GROUP=${GROUP:-}
AGENT_USER=${AGENT_USER:-agent-state}
AGENT_HOME=${AGENT_HOME:-/var/lib/agent-state}
DRY_RUN=${DRY_RUN:-0}

usage() { sed -n '/^# Usage:/,/^# Exit status/p' "$0" | sed 's/^# \{0,1\}//'; }
die() {
    echo "$SCRIPT: error: $1" >&2
    exit "${2:-1}"
}
say() { echo "$SCRIPT: $*"; }

while (($#)); do
    case $1 in
    --dry-run | -n) DRY_RUN=1 ;;
    --config) CONFIG=${2:?--config needs a file}; shift ;;
    --source-config) SOURCE_CONFIG=${2:?--source-config needs a file}; shift ;;
    --state-root) STATE_ROOT=${2:?--state-root needs a directory}; shift ;;
    --bin) BIN=${2:?--bin needs a path}; shift ;;
    --group) GROUP=${2:?--group needs a name}; shift ;;
    --user) AGENT_USER=${2:?--user needs a name}; shift ;;
    --home) AGENT_HOME=${2:?--home needs a directory}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" 64 ;;
    esac
    shift
done

# Run a command, or in a dry run only show it.
run() {
    if [[ $DRY_RUN == 1 ]]; then
        printf '  would run:'
    else
        printf '  +'
    fi
    printf ' %q' "$@"
    echo
    [[ $DRY_RUN == 1 ]] || "$@"
}

# The value of a top-level string key (`key = "value"`) of a TOML file.
toml_string() {
    sed -n "s/^[[:space:]]*$1[[:space:]]*=[[:space:]]*\"\\([^\"]*\\)\".*/\\1/p" "$2" | head -n 1
}

# An absolute path for a state_root read from a config file: relative paths
# are relative to the config's directory (as agent-state reads them).
resolve_from() { # resolve_from CONFIG_FILE PATH
    case $2 in
    /*) realpath -m -- "$2" ;;
    *) realpath -m -- "$(dirname "$1")/$2" ;;
    esac
}

if [[ $DRY_RUN == 1 ]]; then
    say "dry run: nothing will be changed"
elif [[ $(id -u) != 0 ]]; then
    die "run as root (or try --dry-run): this creates a system user and group and sets ownership" 77
fi

# ---- the program ------------------------------------------------------------
if [[ -z $BIN ]]; then
    if [[ -x /usr/bin/agent-state ]]; then
        BIN=/usr/bin/agent-state
    elif [[ -x /usr/local/bin/agent-state ]]; then
        BIN=/usr/local/bin/agent-state
    else
        BIN=$(command -v agent-state || true)
    fi
fi
[[ -n $BIN && -x $BIN ]] || die "agent-state program not found (install it, or pass --bin PATH or BIN=PATH)" 69
say "program: $BIN ($("$BIN" --version))"

# ---- which config, which root, which group ----------------------------------
if [[ -f $CONFIG ]]; then
    CONFIG_EXISTS=1
    EFFECTIVE_CONFIG=$CONFIG
else
    CONFIG_EXISTS=0
    [[ -f $SOURCE_CONFIG ]] || die "no config at $CONFIG and no $SOURCE_CONFIG to install there" 78
    EFFECTIVE_CONFIG=$SOURCE_CONFIG
fi
configured_root=$(toml_string state_root "$EFFECTIVE_CONFIG")
[[ -n $configured_root ]] || die "$EFFECTIVE_CONFIG has no state_root = \"...\" line" 78
if [[ $CONFIG_EXISTS == 1 ]]; then
    configured_root=$(resolve_from "$CONFIG" "$configured_root")
    if [[ -n $STATE_ROOT && $(realpath -m -- "$STATE_ROOT") != "$configured_root" ]]; then
        die "$CONFIG names state_root $configured_root, not $STATE_ROOT; edit the config or leave STATE_ROOT unset" 78
    fi
    STATE_ROOT=$configured_root
elif [[ -z $STATE_ROOT ]]; then
    # Installed as is: a relative root would be relative to the config's new home.
    STATE_ROOT=$(resolve_from "$CONFIG" "$configured_root")
fi
STATE_ROOT=$(realpath -m -- "$STATE_ROOT")
[[ -n $STATE_ROOT && $STATE_ROOT != / ]] || die "refusing state root '/'" 78
if [[ -z $GROUP ]]; then
    GROUP=$(toml_string group "$EFFECTIVE_CONFIG")
    GROUP=${GROUP:-teleo}
fi
say "config: $CONFIG$([[ $CONFIG_EXISTS == 1 ]] || echo " (to be installed from $SOURCE_CONFIG)")"
say "state root: $STATE_ROOT"
say "user: $AGENT_USER, group: $GROUP"
say "agents: $(sed -n 's/^[[:space:]]*name[[:space:]]*=[[:space:]]*"\([^"]*\)".*/\1/p' "$EFFECTIVE_CONFIG" | tr '\n' ' ')"

# ---- 1. group ----------------------------------------------------------------
say "1. system group $GROUP"
if getent group "$GROUP" >/dev/null; then
    echo "  exists"
else
    run groupadd --system "$GROUP"
fi

# ---- 2. user -----------------------------------------------------------------
say "2. system user $AGENT_USER"
if id -u "$AGENT_USER" >/dev/null 2>&1; then
    echo "  exists (home $(getent passwd "$AGENT_USER" | cut -d: -f6)); left as it is"
    if ! id -nG "$AGENT_USER" | tr ' ' '\n' | grep -qx "$GROUP"; then
        run usermod --append --groups "$GROUP" "$AGENT_USER"
    fi
else
    nologin=/usr/sbin/nologin
    [[ -x $nologin ]] || nologin=/sbin/nologin
    [[ -x $nologin ]] || nologin=/bin/false
    run useradd --system --gid "$GROUP" --home-dir "$AGENT_HOME" --no-create-home \
        --shell "$nologin" --comment "agent-state daemon" "$AGENT_USER"
fi
# The home holds the agents' CLI credentials: the user's alone.
run install -d -o "$AGENT_USER" -g "$GROUP" -m 0700 "$AGENT_HOME"

# ---- 3. config -----------------------------------------------------------------
say "3. config $CONFIG"
if [[ $CONFIG_EXISTS == 1 ]]; then
    echo "  exists; never overwritten"
else
    check_rc=0
    "$BIN" --config "$SOURCE_CONFIG" check >/dev/null 2>&1 || check_rc=$?
    [[ $check_rc != 78 ]] || die "$SOURCE_CONFIG is not a valid config; see: $BIN --config $SOURCE_CONFIG check" 78
    [[ -d $(dirname "$CONFIG") ]] || run install -d -m 0755 "$(dirname "$CONFIG")"
    if [[ $STATE_ROOT != "$(resolve_from "$CONFIG" "$configured_root")" ]]; then
        echo "  with state_root = \"$STATE_ROOT\""
    fi
    if [[ $DRY_RUN == 1 ]]; then
        echo "  would install $SOURCE_CONFIG as $CONFIG (0644, root:$GROUP)"
    elif [[ $STATE_ROOT != "$(resolve_from "$CONFIG" "$configured_root")" ]]; then
        tmp_config=$(mktemp)
        trap 'rm -f "$tmp_config"' EXIT
        escaped=$(printf '%s' "$STATE_ROOT" | sed 's/[\\|&]/\\&/g')
        sed "s|^\([[:space:]]*state_root[[:space:]]*=[[:space:]]*\)\"[^\"]*\"|\1\"$escaped\"|" \
            "$SOURCE_CONFIG" >"$tmp_config"
        run install -m 0644 -o root -g "$GROUP" "$tmp_config" "$CONFIG"
    else
        run install -m 0644 -o root -g "$GROUP" "$SOURCE_CONFIG" "$CONFIG"
    fi
fi

# ---- 4. state root and agents ----------------------------------------------
say "4. state root and agents"
if [[ -d $STATE_ROOT ]]; then
    echo "  $STATE_ROOT exists"
else
    [[ -d $(dirname "$STATE_ROOT") ]] || run mkdir -p -m 0755 "$(dirname "$STATE_ROOT")"
    run install -d -m 0755 -o "$AGENT_USER" -g "$GROUP" "$STATE_ROOT"
fi
run "$BIN" --config "$CONFIG" bootstrap

# ---- 5. ownership and modes -----------------------------------------------------
say "5. ownership $AGENT_USER:$GROUP and modes"
if [[ $DRY_RUN == 1 ]]; then
    echo "  would run: chown -hR $AGENT_USER:$GROUP $STATE_ROOT"
    echo "  would set: $STATE_ROOT, .shared/, .shared/rules/, each agent directory and its sessions/ 0755;"
    echo "             .daemon/ 0750; each agent's inbox/ and inbox/.tmp/ 3770; inbox/processed/,"
    echo "             inbox/rejected/, inbox/.claimed/ and the directories in it 2750; messages 0640;"
    echo "             .lock, .daemon/lock, .daemon/counters.lock 0600; report/tasks/session/metrics"
    echo "             .json, memory.md, journal.jsonl,"
    echo "             identity.md, rules.md, prompt.md 0644"
else
    run chown -hR "$AGENT_USER:$GROUP" "$STATE_ROOT"
    run chmod 0755 "$STATE_ROOT"
    [[ ! -d $STATE_ROOT/.daemon ]] || run chmod 0750 "$STATE_ROOT/.daemon"
    for f in "$STATE_ROOT/.daemon/lock" "$STATE_ROOT/.daemon/counters.lock"; do
        [[ ! -f $f || -L $f ]] || run chmod 0600 "$f"
    done
    for d in "$STATE_ROOT/.shared" "$STATE_ROOT/.shared/rules"; do
        [[ ! -d $d ]] || run chmod 0755 "$d"
    done
    for agent_dir in "$STATE_ROOT"/*/; do
        agent_dir=${agent_dir%/}
        [[ -d $agent_dir && ! -L $agent_dir ]] || continue
        run chmod 0755 "$agent_dir"
        [[ ! -d $agent_dir/sessions ]] || run chmod 0755 "$agent_dir/sessions"
        if [[ -d $agent_dir/inbox && ! -L $agent_dir/inbox ]]; then
            # (find never follows links: -P is its default.)
            inbox=$agent_dir/inbox
            echo "  + find $inbox -type d -exec chmod 2750 {} + -o -type f -exec chmod 0640 {} +"
            find "$inbox" -type d -exec chmod 2750 {} + -o -type f -exec chmod 0640 {} +
            run chmod 3770 "$inbox"
            [[ ! -d $inbox/.tmp || -L $inbox/.tmp ]] || run chmod 3770 "$inbox/.tmp"
        fi
        [[ ! -f $agent_dir/.lock || -L $agent_dir/.lock ]] || run chmod 0600 "$agent_dir/.lock"
        files=()
        for f in report.json tasks.json session.json metrics.json memory.md journal.jsonl \
            identity.md rules.md prompt.md; do
            if [[ -f $agent_dir/$f && ! -L $agent_dir/$f ]]; then
                files+=("$agent_dir/$f")
            fi
        done
        if ((${#files[@]})); then
            run chmod 0644 "${files[@]}"
        fi
    done
fi

if [[ $DRY_RUN == 1 ]]; then
    say "dry run done: nothing was changed"
else
    say "done. Check with: $BIN --config $CONFIG check"
fi
