#!/usr/bin/env bash
# research-session.example.sh AGENT — one research session of one agent, in the
# shape of the origin server's research-session.sh, with the agent-state hooks
# of seed 001 ("Integration Points") at their documented places:
#
#   HOOK 1  pre-session   `agent-state session begin`  before the work tree is touched
#   HOOK 2  post-session  `agent-state session end`    after commit, push and PR
#   HOOK 3  on error      `agent-state session fail`   from the EXIT trap, on any early exit
#
# What it does: take a lock (flock), begin the session (agent-state's own
# guard: one session per agent, whoever started it), create the branch
# AGENT/research-YYYY-MM-DD in the work tree, run
# `claude -p` under `timeout`, commit what the agent wrote, push, open a PR,
# end the session. Any exit after `session begin` that is not the successful
# `session end` (a failing command under `set -e`, SIGTERM/SIGINT/SIGHUP, the
# timeout, a non-zero exit of Claude) records the session as failed exactly
# once: outcome `timeout` when `timeout` fired, `error` otherwise.
#
# Started by the agent-state daemon, AGENT_STATE_SESSION_ID is set and
# `session begin` joins the daemon's session instead of starting a second one;
# started from cron or by hand, `session begin` starts the session. When the
# agent has `verify` commands, the daemon runs this script once per iteration
# in the same session: `session end` (or the trap's `session fail`) is noted,
# and the daemon records the session once, after verification.
#
# Settings (environment):
#   REPO_DIR          git work tree the agent works in   (default /opt/teleo-eval/workspaces/AGENT;
#                     when the daemon gives the session its own worktree, AGENT_STATE_WORKSPACE,
#                     that worktree and the branch the daemon made in it)
#   BRANCH            the research branch                 (default AGENT/research-YYYY-MM-DD, UTC)
#   BASE_BRANCH       branch the research branch starts from and the PR targets (default main)
#   MODEL             model for claude and session.json   (default sonnet)
#   TIMEOUT           session timeout, as timeout(1) takes it: 5400, 90m, 2h (default 5400)
#   KILL_GRACE        SIGKILL this long after SIGTERM     (default 30s)
#   CLAUDE            the claude program                  (default claude)
#   AGENT_STATE_BIN   the agent-state program             (default agent-state)
#   AGENT_STATE_CONFIG  config file for agent-state       (default /etc/agent-state/config.toml)
#   LOCK_DIR          where the per-agent lock file lives (default $XDG_RUNTIME_DIR/research-session,
#                     else $HOME/.cache/research-session, made 0700: never a shared /tmp,
#                     where any local user could create or hold the lock and keep the agent
#                     from starting; a cron run and the daemon's may not share it: `session
#                     begin` is what keeps one session per agent across both)
#   LOCK_WAIT         seconds a script the daemon started waits for the lock (default 30):
#                     a cron run that fired at the same moment holds it only until its own
#                     `session begin` is refused (the daemon's session was begun first).
#                     Run from cron or by hand, the script never waits.
#   LOG_DIR           where Claude's output is kept: the daemon's sessions/ directory of
#                     the agent when the daemon started us (AGENT_STATE_DIR; pruned with the
#                     session's log), else ${XDG_STATE_HOME:-$HOME/.local/state}/research-session.
#                     Never a private /tmp: systemd deletes it at every stop.
#   SOURCES_DIR       archived sources, relative to REPO_DIR (default inbox/archive): new files
#                     there are counted as sources_archived
#   EXTRA_PROMPT_FILE appended to the prompt agent-state assembles (e.g. the research steps)
#   SKIP_PUSH=1       commit only: no push, no PR (also automatic when there is no `origin` remote)
#   SKIP_PR=1         push, but open no PR
#   JQ                jq program used to read Claude's JSON result (default jq; a
#                     plain-shell fallback is used when it is missing)
#
# Standard output carries Claude's output (its JSON result) and nothing else,
# as soon as Claude has exited, whatever the script does next: the daemon reads
# it there (the error matrix: login, API errors; signals and the Context
# Summary; cost and tokens) and keeps it in sessions/{id}.log. Claude's
# stderr is copied to the script's stderr. From cron, redirect both.
#
# Exit status: 0 on success; 75 if another session of AGENT holds the lock or
# agent-state refuses to begin (a session is already running); 124 on timeout;
# otherwise the status of what failed.

set -euo pipefail
set -E # the ERR trap also fires inside functions

readonly SCRIPT=${0##*/}
AGENT=${1:?usage: $SCRIPT AGENT}
if [[ -n ${AGENT_STATE_WORKSPACE:-} ]]; then
    REPO_DIR=$AGENT_STATE_WORKSPACE
else
    REPO_DIR=${REPO_DIR:-/opt/teleo-eval/workspaces/$AGENT}
fi
BASE_BRANCH=${BASE_BRANCH:-main}
MODEL=${MODEL:-sonnet}
TIMEOUT=${TIMEOUT:-5400}
KILL_GRACE=${KILL_GRACE:-30s}
LOCK_WAIT=${LOCK_WAIT:-30}
CLAUDE=${CLAUDE:-claude}
AGENT_STATE_BIN=${AGENT_STATE_BIN:-agent-state}
LOCK_DIR=${LOCK_DIR:-${XDG_RUNTIME_DIR:-${HOME:-/nonexistent}/.cache}/research-session}
if [[ -n ${AGENT_STATE_DIR:-} ]]; then
    LOG_DIR=${LOG_DIR:-$AGENT_STATE_DIR/sessions}
else
    LOG_DIR=${LOG_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/research-session}
fi
SOURCES_DIR=${SOURCES_DIR:-inbox/archive}
EXTRA_PROMPT_FILE=${EXTRA_PROMPT_FILE:-}
SKIP_PUSH=${SKIP_PUSH:-0}
SKIP_PR=${SKIP_PR:-0}
JQ=${JQ:-jq}

DATE=$(date -u +%Y-%m-%d)
BRANCH=${BRANCH:-$AGENT/research-$DATE}

log() { printf '%s %s[%s]: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$SCRIPT" "$AGENT" "$*" >&2; }

# Seconds in a duration such as 5400, 90m, 1h30m (for telling a timeout apart
# from an unrelated SIGKILL). Empty if it cannot be read.
to_seconds() {
    local rest=$1 total=0 n unit
    while [[ $rest =~ ^([0-9]+)([smhd]?)(.*)$ ]]; do
        n=${BASH_REMATCH[1]} unit=${BASH_REMATCH[2]} rest=${BASH_REMATCH[3]}
        case $unit in
        '' | s) total=$((total + n)) ;;
        m) total=$((total + n * 60)) ;;
        h) total=$((total + n * 3600)) ;;
        d) total=$((total + n * 86400)) ;;
        esac
    done
    [[ -z $rest ]] && echo "$total"
}

# ---- lock: one session per agent -------------------------------------------
# flock on a lock file (the kernel drops it when we die, so no stale pid file).
# Children inherit the descriptor: an orphaned Claude keeps the lock until it
# is gone, so a new session cannot start beside it. Between this script run
# from cron and run by the daemon it may not be the same file (see LOCK_DIR);
# `session begin` refuses a second session in either case, and nothing
# touches the work tree before it.
mkdir -p -m 0700 "$LOCK_DIR"
LOCK_FILE="$LOCK_DIR/research-session-$AGENT.lock"
exec {LOCK_FD}>>"$LOCK_FILE"
if ! flock -n "$LOCK_FD"; then
    # Started by the daemon, the session is already begun: a holder is a
    # cron run of the same moment, about to be refused by `session begin`
    # and gone (without this wait both would be refused), or an orphan.
    if [[ -n ${AGENT_STATE_SESSION_ID:-} && $LOCK_WAIT =~ ^[0-9]+$ && $LOCK_WAIT -gt 0 ]]; then
        log "another process holds $LOCK_FILE; waiting up to ${LOCK_WAIT}s for it"
        if flock -w "$LOCK_WAIT" "$LOCK_FD"; then
            log "took $LOCK_FILE"
        else
            log "another session of $AGENT still holds $LOCK_FILE after ${LOCK_WAIT}s; not starting"
            exit 75
        fi
    else
        log "another session of $AGENT holds $LOCK_FILE; not starting"
        exit 75
    fi
fi

# ---- the work tree (read only until the session is ours) --------------------
# Nothing here changes the work tree: another session of this agent (the
# daemon's, under its unit, where this lock file is not the same file) may be
# working in it, and only `session begin` below knows. The branch is made
# after it.
cd "$REPO_DIR"
if [[ -n ${AGENT_STATE_WORKSPACE:-} ]]; then
    # The daemon made this worktree on a new branch from the base: use it.
    BRANCH=$(git branch --show-current)
fi

# ---- the exit trap (HOOK 3) -------------------------------------------------
SESSION_ID=""    # set once `session begin` succeeded
FINISHED=0       # 1 once `session end` or `session fail` has been called
FAIL_OUTCOME=error
FAIL_REASON=""   # set by the step that knows why it failed
STEP="starting"  # what the script is doing, for the failure reason
LAST_ERROR=""    # the last failing command (ERR trap)
AGENT_PID=""     # the `timeout claude` process while it runs
OUT=""           # Claude's stdout and stderr, once it has been started
ERR_LOG=""
OUT_PRINTED=0    # 1 once they were copied to our stdout and stderr
BEGIN_OUT=""     # what `session begin` printed

trap 'LAST_ERROR="\`$BASH_COMMAND\` exited with status $? (line $LINENO)"' ERR

# Claude's output to our stdout (and its stderr to ours), once, as soon as it
# has exited and before anything else can fail: the daemon that started us
# reads the result there, whatever becomes of this script afterwards.
print_claude_output() {
    [[ -n $OUT && $OUT_PRINTED == 0 ]] || return 0
    OUT_PRINTED=1
    cat "$ERR_LOG" >&2 2>/dev/null
    cat "$OUT" 2>/dev/null
    return 0
}

# HOOK 3 — on error/timeout: session.json status error|timeout with the reason,
# report.json with the error, an error|timeout event in journal.jsonl, and the
# claimed inbox messages returned to the inbox. Runs on every exit; does
# nothing before `session begin` or after `session end`.
on_exit() {
    local rc=$?
    trap - EXIT ERR
    trap '' TERM INT HUP # let the failure be recorded
    set +e
    # Stopped right after `session begin` returned: the id is in its output.
    if [[ -z $SESSION_ID && -n $BEGIN_OUT && -s $BEGIN_OUT ]]; then
        SESSION_ID=$(tail -n 1 "$BEGIN_OUT")
        SESSION_ID=${SESSION_ID//[[:space:]]/}
    fi
    [[ -z $BEGIN_OUT ]] || rm -f "$BEGIN_OUT"
    if [[ -n $AGENT_PID ]] && kill -0 "$AGENT_PID" 2>/dev/null; then
        kill -TERM "$AGENT_PID" 2>/dev/null
        wait "$AGENT_PID" 2>/dev/null
    fi
    print_claude_output
    if [[ -n $SESSION_ID && $FINISHED == 0 ]]; then
        FINISHED=1
        local reason=$FAIL_REASON
        if [[ -z $reason ]]; then
            reason="$SCRIPT failed while $STEP (exit status $rc)"
            [[ -n $LAST_ERROR ]] && reason+=": $LAST_ERROR"
        fi
        [[ $rc == 0 ]] && rc=1
        log "recording session $SESSION_ID as $FAIL_OUTCOME: $reason"
        "$AGENT_STATE_BIN" session fail "$AGENT" --session "$SESSION_ID" \
            --outcome "$FAIL_OUTCOME" --reason "$reason" >&2 ||
            log "warning: agent-state session fail did not record the failure"
    fi
    exit "$rc"
}
on_signal() {
    FAIL_REASON="$SCRIPT was stopped by SIG$1 while $STEP"
    exit "$2"
}
trap on_exit EXIT
trap 'on_signal TERM 143' TERM
trap 'on_signal INT 130' INT
trap 'on_signal HUP 129' HUP

# ---- HOOK 1 — pre-session ---------------------------------------------------
# session.json running, report.json researching, session_start in the journal,
# inbox messages claimed for this session (task messages become tasks).
# Prints the session id; joins the daemon's session when
# AGENT_STATE_SESSION_ID is set. Exit 65 means a bad argument was noted in
# session.json while everything else was recorded: the session has begun.
#
# Not `SESSION_ID=$(agent-state session begin ...)`: agent-state records its
# parent process as the session's owner, and a command substitution may run it
# from a short-lived subshell (bash does so here, with the ERR trap and set -E),
# which would make the running session look abandoned. Run it from this shell
# and read the id from a file.
STEP="beginning the session"
BEGIN_OUT=$(mktemp "${TMPDIR:-/tmp}/research-session-$AGENT.XXXXXX")
begin_rc=0
"$AGENT_STATE_BIN" session begin "$AGENT" --type research \
    --branch "$BRANCH" --model "$MODEL" --timeout "$TIMEOUT" >"$BEGIN_OUT" || begin_rc=$?
SESSION_ID=$(tail -n 1 "$BEGIN_OUT")
SESSION_ID=${SESSION_ID//[[:space:]]/}
rm -f "$BEGIN_OUT"
BEGIN_OUT=""
if [[ $begin_rc != 0 ]]; then
    if [[ $begin_rc == 65 && -n $SESSION_ID ]]; then
        log "warning: session begin noted a bad argument (see session.json errors)"
    else
        # Nothing was begun (75: another session is running): nothing to fail.
        SESSION_ID=""
        log "agent-state session begin failed (exit $begin_rc); not starting"
        exit "$begin_rc"
    fi
fi
log "session $SESSION_ID on branch $BRANCH"

# ---- branch -----------------------------------------------------------------
# Only now that the session is ours: a failure here is recorded as the
# session's failure by the exit trap.
STEP="creating the branch $BRANCH"
if git remote get-url origin >/dev/null 2>&1; then
    HAVE_REMOTE=1
else
    HAVE_REMOTE=0
fi
if [[ $HAVE_REMOTE == 1 && -z ${AGENT_STATE_WORKSPACE:-} ]]; then
    git fetch --quiet origin "$BASE_BRANCH" || log "warning: could not fetch origin/$BASE_BRANCH; branching from the local $BASE_BRANCH"
fi
BASE_REF=$BASE_BRANCH
if [[ $HAVE_REMOTE == 1 ]] && git rev-parse --verify --quiet "refs/remotes/origin/$BASE_BRANCH" >/dev/null; then
    BASE_REF=origin/$BASE_BRANCH
fi
if [[ -n ${AGENT_STATE_WORKSPACE:-} ]]; then
    log "working in the daemon's worktree $REPO_DIR on branch $BRANCH"
elif git rev-parse --verify --quiet "refs/heads/$BRANCH" >/dev/null; then
    log "continuing today's branch $BRANCH"
    git checkout --quiet "$BRANCH"
else
    git checkout --quiet --no-track -b "$BRANCH" "$BASE_REF"
fi

# The prompt: identity, rules, memory.md, tasks, the claimed inbox messages and
# the last handoff notes, as agent-state assembles them (the daemon has already
# written it to AGENT_STATE_PROMPT_FILE when it started us).
STEP="assembling the prompt"
if [[ -n ${AGENT_STATE_PROMPT_FILE:-} && -r ${AGENT_STATE_PROMPT_FILE:-} ]]; then
    PROMPT=$(<"$AGENT_STATE_PROMPT_FILE")
else
    PROMPT=$("$AGENT_STATE_BIN" prompt "$AGENT")
fi
if [[ -n $EXTRA_PROMPT_FILE ]]; then
    PROMPT+=$'\n\n'$(<"$EXTRA_PROMPT_FILE")
fi

# ---- run the agent ----------------------------------------------------------
STEP="running $CLAUDE"
mkdir -p "$LOG_DIR"
# `{id}.claude.json`: the daemon prunes these with the session's log.
OUT="$LOG_DIR/$SESSION_ID.claude.json"
ERR_LOG="$LOG_DIR/$SESSION_ID.claude.stderr"
# Readable by the group, as the daemon's own session logs are: not by everyone.
(umask 027 && : >"$OUT" && : >"$ERR_LOG")
log "running $CLAUDE (model $MODEL, timeout $TIMEOUT); output in $OUT"
started=$SECONDS
# In the background and waited for, so that a SIGTERM to this script is acted
# on at once (timeout(1) runs in its own process group and would not get it).
# A prompt too long for one argument goes on standard input instead.
if ((${#PROMPT} < 100000)); then
    timeout --kill-after="$KILL_GRACE" "$TIMEOUT" \
        "$CLAUDE" -p "$PROMPT" --model "$MODEL" --output-format json \
        </dev/null >"$OUT" 2>"$ERR_LOG" &
else
    timeout --kill-after="$KILL_GRACE" "$TIMEOUT" \
        "$CLAUDE" -p --model "$MODEL" --output-format json \
        <<<"$PROMPT" >"$OUT" 2>"$ERR_LOG" &
fi
AGENT_PID=$!
agent_rc=0
wait "$AGENT_PID" || agent_rc=$?
AGENT_PID=""
elapsed=$((SECONDS - started))
print_claude_output

# Claude Code's `--output-format json` result (jq if there is one).
json_field() { # json_field FILTER FALLBACK-KEY: a number or true/false
    if command -v "$JQ" >/dev/null 2>&1; then
        "$JQ" -r "($1) // empty" "$OUT" 2>/dev/null | head -n 1
    else
        grep -o "\"$2\"[[:space:]]*:[[:space:]]*[0-9a-z.eE+-]*" "$OUT" 2>/dev/null |
            head -n 1 | sed 's/.*:[[:space:]]*//'
    fi
}
json_result_text() { # the "result" string
    if command -v "$JQ" >/dev/null 2>&1; then
        "$JQ" -r '.result // empty | strings' "$OUT" 2>/dev/null
    else
        sed -n 's/.*"result"[[:space:]]*:[[:space:]]*"\(\([^"\\]\|\\.\)*\)".*/\1/p' "$OUT" 2>/dev/null |
            head -n 1 | sed 's/\\n/ /g; s/\\"/"/g; s/\\\\/\\/g'
    fi
}
is_error=$(json_field '.is_error' is_error || true)
result_text=$(json_result_text || true)
cost_usd=$(json_field '.total_cost_usd' total_cost_usd || true)
tokens_used=""
if command -v "$JQ" >/dev/null 2>&1; then
    tokens_used=$("$JQ" -r '.usage // empty | [.input_tokens, .cache_creation_input_tokens,
        .cache_read_input_tokens, .output_tokens] | map(. // 0) | add' "$OUT" 2>/dev/null || true)
else
    for key in input_tokens cache_creation_input_tokens cache_read_input_tokens output_tokens; do
        n=$(json_field '' "$key" || true)
        [[ $n =~ ^[0-9]+$ ]] && tokens_used=$((${tokens_used:-0} + n))
    done
fi

timeout_seconds=$(to_seconds "$TIMEOUT" || true)
if [[ $agent_rc == 124 ]] ||
    [[ $agent_rc == 137 && -n $timeout_seconds && $elapsed -ge $timeout_seconds ]]; then
    FAIL_OUTCOME=timeout
    FAIL_REASON="$CLAUDE ran past the ${TIMEOUT} timeout (timeout exit $agent_rc after ${elapsed}s)"
    exit 124
fi
if [[ $agent_rc != 0 || $is_error == true ]]; then
    FAIL_REASON="$CLAUDE exited with status $agent_rc"
    [[ $is_error == true ]] && FAIL_REASON+=" and reported an error"
    detail=${result_text:-$(tail -n 3 "$ERR_LOG" 2>/dev/null | tr '\n' ' ')}
    [[ -n $detail ]] && FAIL_REASON+=": ${detail:0:300}"
    exit $((agent_rc == 0 ? 1 : agent_rc))
fi

# ---- commit, push, PR -------------------------------------------------------
STEP="committing"
git add -A
sources_archived=$(git diff --cached --name-only --diff-filter=A -- "$SOURCES_DIR" | grep -c . || true)
pr=""
if git diff --cached --quiet; then
    log "the agent changed nothing; no commit"
else
    message=("-m" "$AGENT: research session $DATE ($SESSION_ID)")
    [[ -n $result_text ]] && message+=("-m" "${result_text:0:2000}")
    git commit --quiet "${message[@]}"
fi
if [[ $(git rev-list --count "$BASE_REF..HEAD") == 0 ]]; then
    log "no commits on $BRANCH beyond $BASE_REF; nothing to push"
elif [[ $SKIP_PUSH == 1 || $HAVE_REMOTE == 0 ]]; then
    log "not pushing (SKIP_PUSH=$SKIP_PUSH, origin remote: $HAVE_REMOTE)"
else
    STEP="pushing $BRANCH"
    git push --quiet -u origin "$BRANCH"
    if [[ $SKIP_PR == 1 ]]; then
        log "not opening a PR (SKIP_PR=1)"
    else
        STEP="opening the PR"
        pr=$(gh pr view "$BRANCH" --json number --jq .number 2>/dev/null || true)
        if [[ -z $pr ]]; then
            pr=$(gh pr create --base "$BASE_BRANCH" --head "$BRANCH" \
                --title "$AGENT: research $DATE" \
                --body "Research session $SESSION_ID of $AGENT: $sources_archived source(s) archived.")
        fi
        pr=$(printf '%s\n' "$pr" | tail -n 1)
        log "PR: $pr"
    fi
fi

# ---- HOOK 2 — post-session --------------------------------------------------
# session.json completed with sources, branch, PR; report.json idle with the
# summary; metrics.json counters; session_end in the journal; the claimed inbox
# messages moved to processed/. Exit 65: a bad value was noted, the rest
# recorded — the session has ended all the same.
#
# The agent's signals (<axiom>...</axiom>) are for the daemon, not for people:
# they are left out of the summary and the handoff notes. An agent that ends
# with a Context Summary Block (seed 004) says itself what the summary and the
# handoff notes are; under the daemon, which reads it from our stdout, they
# are left to it (the values given here would win over the block).
STEP="ending the session"
prose=$(printf '%s\n' "$result_text" | sed 's/<axiom>[^<]*<\/axiom>//g')
end_args=(--session "$SESSION_ID" --sources-archived "$sources_archived" --branch "$BRANCH")
if [[ -z ${AGENT_STATE_SESSION_ID:-} ]] || ! grep -qi 'context summary' <<<"$result_text"; then
    summary="Research session: $sources_archived source(s) archived on $BRANCH"
    first_line=$(printf '%s\n' "$prose" | sed -n '/[^[:space:]]/{p;q;}')
    [[ -n $first_line ]] && summary+=" — ${first_line:0:200}"
    end_args+=(--summary "$summary")
    [[ $prose =~ [^[:space:]] ]] && end_args+=(--handoff-notes "${prose:0:2000}")
fi
[[ -n $pr ]] && end_args+=(--pr "$pr")
[[ $tokens_used =~ ^[0-9]+$ ]] && end_args+=(--tokens-used "$tokens_used")
[[ $cost_usd =~ ^[0-9.]+$ ]] && end_args+=(--cost-usd "$cost_usd")
end_rc=0
"$AGENT_STATE_BIN" session end "$AGENT" "${end_args[@]}" >&2 || end_rc=$?
if [[ $end_rc != 0 && $end_rc != 65 ]]; then
    FAIL_REASON="agent-state session end failed with exit status $end_rc"
    exit "$end_rc"
fi
FINISHED=1
log "session $SESSION_ID completed ($sources_archived source(s), ${elapsed}s)"
