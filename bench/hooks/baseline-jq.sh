#!/usr/bin/env bash
# jq + mv baseline for the `agent-state session begin|end` hooks (benchmark only).
#
#   baseline-jq.sh --config CFG session begin AGENT [--type T] [--branch B] [--model M]
#                  [--timeout DUR] [--research-question Q] [--belief-targeted X]
#                  [--disconfirmation-target X] [--sources-expected N]
#   baseline-jq.sh --config CFG session end AGENT [--session ID] [--sources-archived N]
#                  [--branch B] [--summary S] [--next-priority P] [--handoff-notes H]
#
# Same on-disk work as crates/store/src/hooks.rs begin()/end() on the path the benchmark takes,
# with util-linux flock, jq, mv and coreutils sync:
#
#   * the whole hook holds `flock` on {agent}/.lock (fd 9, kept by this shell);
#   * begin takes the session's instance id (rio-001, rio-002, …) as
#     crates/store/src/state/counters.rs next_instance() does: `flock` on
#     {root}/.daemon/counters.lock (fd 8, created 0600), jq increments the
#     agent's counter in {root}/.daemon/counters.json (a missing one starts
#     above the highest instance in the agent's journal, which is then read),
#     written back like the other files, and fd 8 is closed;
#   * journal.jsonl: the line is built by jq and written with one `>>` (O_APPEND)
#     write, then `sync -d` (fdatasync); a newline first if the last line is torn
#     (checked with `tail -c1`); `sync DIR` when the journal was empty;
#   * session.json, report.json, metrics.json, counters.json: jq reads the
#     current file and writes the new document to a temp file created with
#     O_EXCL (`set -C`), then `sync TMP` (fsync) + `mv` (rename) + `sync DIR`
#     (fsync of the directory). The mode is 0644 from `umask 022` at creation
#     instead of a separate chmod (same result, one process fewer per file:
#     this favours the baseline). session.json and report.json are staged
#     (temp file written and synced) before the journal line and renamed in
#     after it (crates/store/src/state/atomic.rs Staged, crates/store/src/hooks.rs begin, finish_with);
#   * begin globs inbox/*.json for messages to claim, end lists
#     inbox/.claimed/{session}/ before the journal line and, after it, moves
#     the messages to processed/ and removes the directory;
#   * the owner lock (crates/store/src/owner.rs): begin creates sessions/{id}.owner (0644),
#     takes `flock -xn` on it (fd 7) before the journal line and hands it to a
#     detached keeper (`setsid bash`, polling) that holds it until the script
#     exits or the file goes; end removes the file after its renames;
#   * metrics.json: lifetime counters incremented, a session's end counted
#     once (counted_session); at end the rolling 30-day window is recomputed
#     from the whole journal (jq --rawfile); a plain session start changes no
#     counter, so metrics.json is not rewritten then (crates/store/src/state/metrics.rs apply).
#
# The config is read with bash builtins (string values only: state_root, and
# model/timeout/session_type/domain of [defaults] and the agent's [[agent]]).
# Not implemented (never reached by the benchmark): joining or recovering a
# running session (refused, exit 75), message validation, flags into memory.md,
# tasks from messages, --pr/--tokens-used/--cost-usd/--outcome, setting aside a
# corrupt counters.json, the chmod of a lock file that is not 0600.

set -euo pipefail
set -C            # `>` creates with O_EXCL: the temp files are never clobbered
shopt -s nullglob
umask 022
export TZ=UTC

die() { printf 'baseline-jq: error: %s\n' "$1" >&2; exit "${2:-70}"; }

trim() { # trim VALUE VAR
    local v=$1
    v=${v#"${v%%[![:space:]]*}"}
    v=${v%"${v##*[![:space:]]}"}
    printf -v "$2" %s "$v"
}

duration() { # duration TEXT VAR: seconds (bare number, or 90m, 1h30m, 45s, 2d), or ""
    local t=$1 total=0 n u
    trim "$t" t
    if [[ $t =~ ^[0-9]+$ ]]; then printf -v "$2" %s "$((10#$t))"; return; fi
    [[ -n $t ]] || { printf -v "$2" ''; return; }
    while [[ $t =~ ^([0-9]+)[[:space:]]*(s|sec|m|min|h|hr|d)[[:space:]]*(.*)$ ]]; do
        n=$((10#${BASH_REMATCH[1]})) u=${BASH_REMATCH[2]} t=${BASH_REMATCH[3]}
        case $u in s|sec) ;; m|min) n=$((n * 60)) ;; h|hr) n=$((n * 3600)) ;; d) n=$((n * 86400)) ;; esac
        total=$((total + n))
    done
    if [[ -z $t && $total -gt 0 ]]; then printf -v "$2" %s "$total"; else printf -v "$2" ''; fi
}

# ---- arguments and config ----------------------------------------------------

config=${AGENT_STATE_CONFIG:-/etc/agent-state/config.toml}
if [[ ${1-} == --config ]]; then config=${2-}; shift 2 || die "--config: missing value" 64; fi
[[ ${1-} == session && ( ${2-} == begin || ${2-} == end ) && -n ${3-} ]] \
    || die "usage: baseline-jq.sh --config CFG session begin|end AGENT [options]" 64
hook=$2 agent=$3
shift 3
declare -A opt=()
while (($#)); do
    (($# >= 2)) || die "$1: missing value" 64
    opt[$1]=$2
    shift 2
done

state_root='' d_model=sonnet d_timeout=90m d_type=research
a_found='' a_kind='' a_domain='' a_model='' a_timeout='' a_type=''
section='' t_name='' t_kind='' t_domain='' t_model='' t_timeout='' t_type=''
flush_table() {
    if [[ $section == agent && $t_name == "$agent" ]]; then
        a_found=1 a_kind=$t_kind a_domain=$t_domain a_model=$t_model a_timeout=$t_timeout a_type=$t_type
    fi
    t_name='' t_kind='' t_domain='' t_model='' t_timeout='' t_type=''
}
[[ -r $config ]] || die "cannot read $config" 78
while IFS= read -r line || [[ -n $line ]]; do
    if [[ $line =~ ^[[:space:]]*\[\[[[:space:]]*agent[[:space:]]*\]\] ]]; then
        flush_table; section=agent; continue
    elif [[ $line =~ ^[[:space:]]*\[([^]]*)\] ]]; then
        flush_table; section=${BASH_REMATCH[1]}; continue
    fi
    [[ $line =~ ^[[:space:]]*([A-Za-z_]+)[[:space:]]*=[[:space:]]*\"([^\"]*)\" ]] || continue
    k=${BASH_REMATCH[1]} v=${BASH_REMATCH[2]}
    case $section:$k in
        :state_root) state_root=$v ;;
        defaults:model) d_model=$v ;;
        defaults:timeout) d_timeout=$v ;;
        defaults:session_type) d_type=$v ;;
        agent:name) t_name=$v ;;
        agent:kind) t_kind=$v ;;
        agent:domain) t_domain=$v ;;
        agent:model) t_model=$v ;;
        agent:timeout) t_timeout=$v ;;
        agent:session_type) t_type=$v ;;
    esac
done <"$config"
flush_table
[[ -n $state_root ]] || die "$config: state_root is missing" 78
[[ -n $a_found ]] || die "unknown agent '$agent'" 67
[[ $a_kind != human ]] || die "$agent is a human mailbox (kind = \"human\"): it has no sessions" 64
if [[ $state_root != /* ]]; then
    if [[ $config == */* ]]; then state_root=${config%/*}/$state_root; else state_root=./$state_root; fi
fi

D=$state_root/$agent
S=$D/session.json R=$D/report.json M=$D/metrics.json J=$D/journal.jsonl
CLAIMED=$D/inbox/.claimed

printf -v epoch '%(%s)T' -1
printf -v now '%(%Y-%m-%dT%H:%M:%SZ)T' "$epoch"
printf -v base '%(%Y%m%d-%H%M%S)T' "$epoch"

# ---- the primitives ----------------------------------------------------------

# open_lock FD PATH MODE-UMASK: open for reading (crates/store/src/state/lock.rs
# open_lock_file), creating it first, with the umask giving its mode, if missing.
open_lock() {
    if [[ ! -e $2 ]]; then umask "$3"; : >>"$2"; umask 022; fi
    eval "exec $1<\"\$2\""
}

[[ -d $D ]] || die "$D is not bootstrapped" 66
open_lock 9 "$D/.lock" 077
flock 9 # held until this shell exits

# journal_append LINE: one O_APPEND write, fdatasync
journal_append() {
    local prefix='' empty=1
    if [[ -s $J ]]; then
        empty=''
        [[ -z $(tail -c1 "$J") ]] || prefix=$'\n'
    fi
    printf '%s%s\n' "$prefix" "$1" >>"$J"
    sync -d "$J"
    [[ -n $empty ]] && sync "$D"
    return 0
}

# stage_json TARGET JQ-ARGS...: jq → O_EXCL temp beside TARGET → fsync; the
# temp file's name is left in $staged, for commit.
stage_json() {
    local target=$1
    shift
    staged=${target%/*}/.${target##*/}.$$.$RANDOM.tmp
    if ! jq "$@" >"$staged"; then
        rm -f "$staged"
        die "jq failed writing $target" 65
    fi
    sync "$staged"
}

# commit TMP TARGET: rename → fsync(dir)
commit() {
    mv -f "$1" "$2"
    sync "${2%/*}"
}

# commit_all TMP TARGET [TMP TARGET...]: rename each → one fsync of their
# directory (all in the agent's directory here)
commit_all() {
    local dir=${2%/*}
    while (($#)); do
        mv -f "$1" "$2"
        shift 2
    done
    sync "$dir"
}

# write_json TARGET JQ-ARGS...: jq → O_EXCL temp → fsync → rename → fsync(dir)
write_json() {
    stage_json "$@"
    commit "$staged" "$1"
}

# input FILE: the file jq should read with `input` (an empty one if missing)
input_of() { if [[ -e $1 ]]; then printf %s "$1"; else printf /dev/null; fi; }

# jq definitions shared by the filters: documents in the Rust field order.
JQ_DEFS='
def n: if . == "" then null else . end;
def obj: if type == "object" then . else {} end;
def session_doc:
  obj as $s
  | {agent: $s.agent, session_id: ($s.session_id // ""), started_at: $s.started_at,
     ended_at: $s.ended_at, type: ($s.type // "research"), domain: $s.domain,
     branch: $s.branch, status: $s.status, model: $s.model,
     timeout_seconds: $s.timeout_seconds, research_question: $s.research_question,
     belief_targeted: $s.belief_targeted, disconfirmation_target: $s.disconfirmation_target,
     sources_archived: $s.sources_archived, sources_expected: $s.sources_expected,
     tokens_used: $s.tokens_used, cost_usd: $s.cost_usd, errors: ($s.errors // []),
     handoff_notes: $s.handoff_notes}
  + (reduce ("pr_number", "reason", "owner_pid", "owner_start", "instance", "messages") as $k
       ({}; if $s[$k] == null or $s[$k] == [] then . else .[$k] = $s[$k] end))
  + ($s | del(.agent, .session_id, .started_at, .ended_at, .type, .domain, .branch, .status,
              .model, .timeout_seconds, .research_question, .belief_targeted,
              .disconfirmation_target, .sources_archived, .sources_expected, .tokens_used,
              .cost_usd, .errors, .handoff_notes, .pr_number, .reason, .owner_pid,
              .owner_start, .instance, .messages));
def last_session_doc:
  if type == "object" then
    . as $l
    | {id: ($l.id // ""), started_at: $l.started_at, ended_at: $l.ended_at, outcome: $l.outcome,
       sources_archived: $l.sources_archived, branch: $l.branch, pr_number: $l.pr_number}
    + (if $l.reason == null then {} else {reason: $l.reason} end)
    + ($l | del(.id, .started_at, .ended_at, .outcome, .sources_archived, .branch, .pr_number, .reason))
  else null end;
def report_doc:
  obj as $r
  | {agent: $r.agent, updated_at: $r.updated_at, status: ($r.status // "idle"),
     summary: $r.summary, current_task: $r.current_task,
     last_session: ($r.last_session | last_session_doc), blocked_by: $r.blocked_by,
     next_priority: $r.next_priority}
  + (reduce ("current_session", "instance", "next_wake_at", "error", "lifecycle") as $k
       ({}; if $r[$k] == null then . else .[$k] = $r[$k] end))
  + ($r | del(.agent, .updated_at, .status, .summary, .current_task, .last_session,
              .blocked_by, .next_priority, .current_session, .instance, .next_wake_at,
              .error, .lifecycle));
def lifetime_keys: ["sessions_total", "sessions_completed", "sessions_timeout",
  "sessions_error", "sources_archived", "claims_proposed", "claims_accepted",
  "claims_challenged", "claims_rejected", "disconfirmation_attempts",
  "disconfirmation_hits", "cross_agent_flags_sent", "cross_agent_flags_received"];
def rolling_keys: ["sessions", "sources_archived", "claims_proposed", "acceptance_rate",
  "avg_sources_per_session", "error_rate"];
def counters($keys): obj as $o
  | (reduce $keys[] as $k ({}; .[$k] = ($o[$k] // 0))) + ($o | delpaths([$keys[] | [.]]));
def metrics_doc:
  obj as $m
  | {agent: $m.agent, updated_at: $m.updated_at,
     lifetime: ($m.lifetime | counters(lifetime_keys)),
     rolling_30d: ($m.rolling_30d | counters(rolling_keys))}
  + (if $m.counted_session == null then {} else {counted_session: $m.counted_session} end)
  + ($m | del(.agent, .updated_at, .lifetime, .rolling_30d, .counted_session));
def ratio(a; b): if b == 0 then 0.0 else ((a / b * 10000 + 0.5) | floor) / 10000 end;
def rolling($text; $now):
  ($now | fromdateiso8601) as $n | ($n - 2592000) as $since
  | [ $text | split("\n")[] | select(length > 0) | (try fromjson catch null)
      | select(type == "object")
      | select((try (.ts | fromdateiso8601) catch null) as $t
               | $t != null and $t >= $since and $t <= $n) ]
  | ([ .[] | select(.event == "session_end" or .event == "timeout" or .event == "error")
       | .session_id ] | unique | length) as $sessions
  | ([ .[] | select(.event == "timeout" or .event == "error") | .session_id ]
     | unique | length) as $failed
  | ([ .[] | select(.event == "session_end") | .sources_archived // 0 ] | add // 0) as $sources
  | ([ .[] | select(.event == "record") | .claims_proposed // 0 ] | add // 0) as $proposed
  | ([ .[] | select(.event == "record") | .claims_accepted // 0 ] | add // 0) as $accepted
  | {sessions: $sessions, sources_archived: $sources, claims_proposed: $proposed,
     acceptance_rate: ratio($accepted; $proposed),
     avg_sources_per_session: ratio($sources; $sessions),
     error_rate: ratio($failed; $sessions)};
def bad_count($flag; $raw; $now):
  {at: $now, code: "BAD_ARGUMENT", argument: $flag, value: $raw,
   message: "not a whole number; the field was left unset"};
'

read_session() { # sets cur_status cur_id
    cur_status='' cur_id=''
    [[ -e $S ]] || return 0
    local out
    out=$(jq -r '"\(.status // "")\t\(.session_id // "")"' "$S") || die "$S is corrupt" 65
    cur_status=${out%%$'\t'*} cur_id=${out#*$'\t'}
}

# next_instance: sets $instance to the session's instance id (rio-047), as
# crates/store/src/state/counters.rs next_instance() takes it. The journal is passed to jq
# only when the agent has no counter yet (as Rust reads it only then).
next_instance() {
    local dir=$state_root/.daemon text='' re="\"$agent\": ([0-9]+)" from_journal
    [[ -d $dir ]] || mkdir -p -m 750 "$dir"
    local C=$dir/counters.json
    open_lock 8 "$dir/counters.lock" 077
    flock 8
    if [[ -e $C ]]; then read -r -d '' text <"$C" || true; fi
    if [[ $text =~ $re && ${BASH_REMATCH[1]} =~ [1-9] ]]; then
        from_journal=(--arg journal '')
    else
        from_journal=(--rawfile journal "$(input_of "$J")")
    fi
    write_json "$C" -n --arg agent "$agent" "${from_journal[@]}" '
        (try input catch {}) | (if type == "object" then . else {} end) as $doc0
        | (if ($doc0.counters | type) == "object" then $doc0.counters else {} end) as $nested
        | ($doc0 | del(.counters)) as $doc
        | ($nested + ($doc | with_entries(select(.value | type == "number")))) as $c
        | ($c[$agent] // 0) as $n
        | (if $n != 0 then $n
           else [ $journal | split("\n")[] | select(length > 0) | (try fromjson catch null)
                  | select(type == "object" and .event == "session_start")
                  | .instance | select(type == "string" and startswith($agent + "-"))
                  | .[($agent | length) + 1:] | select(test("^[0-9]+$")) | tonumber ]
                | max // 0
           end) as $n
        | ($doc | with_entries(select(.value | type != "number")))
          + ($c + {($agent): ($n + 1)} | to_entries | sort_by(.key) | from_entries)' "$(input_of "$C")"
    read -r -d '' text <"$C" || true
    [[ $text =~ $re ]] || die "$C: no counter for $agent after writing it" 70
    printf -v instance '%s-%03d' "$agent" "$((10#${BASH_REMATCH[1]}))"
    exec 8<&- # releases the counters lock
}

# ---- begin -------------------------------------------------------------------

begin() {
    local kind timeout model branch rq bt dt se='null' bad_se='' raw sid n suffix
    trim "${opt[--type]-}" kind
    kind=${kind:-${a_type:-$d_type}}
    duration "${a_timeout:-$d_timeout}" timeout
    [[ -n $timeout ]] || die "$config: bad timeout" 78
    if [[ -n ${opt[--timeout]+x} ]]; then
        duration "${opt[--timeout]}" raw
        timeout=${raw:-$timeout}
    fi
    if [[ -n ${opt[--sources-expected]+x} ]]; then
        trim "${opt[--sources-expected]}" raw
        if [[ $raw =~ ^[0-9]+$ ]]; then se=$((10#$raw)); else bad_se=${opt[--sources-expected]}; fi
    fi
    trim "${opt[--model]-}" model
    model=${model:-${a_model:-$d_model}}
    trim "${opt[--branch]-}" branch
    trim "${opt[--research-question]-}" rq
    trim "${opt[--belief-targeted]-}" bt
    trim "${opt[--disconfirmation-target]-}" dt

    read_session
    [[ $cur_status != running ]] \
        || die "$agent: session $cur_id is running (the baseline does not join or recover sessions)" 75

    # new_session_id (crates/store/src/hooks/begin.rs): YYYYMMDD-HHMMSS, then -2, -3, …
    taken() { [[ $1 == "$cur_id" || -e $CLAIMED/$1 ]]; }
    if ! taken "$base" && [[ $cur_id != "$base"-* ]]; then
        sid=$base
    else
        suffix=${cur_id#"$base"-}
        if [[ $cur_id == "$base"-* && $suffix =~ ^[0-9]+$ ]]; then n=$((10#$suffix + 1)); else n=2; fi
        while taken "$base-$n"; do n=$((n + 1)); done
        sid=$base-$n
    fi

    # A new session is a spawn: it gets an instance id.
    local instance
    next_instance

    # claim: list the inbox, move what waits to .claimed/{sid}/
    local msgs='' f name files=("$D"/inbox/*.json)
    if ((${#files[@]})); then
        mkdir -p -m 2770 "$CLAIMED/$sid"
        for f in "${files[@]}"; do
            name=${f##*/}
            mv "$f" "$CLAIMED/$sid/$name"
            msgs+=${name%.json}$'\n'
        done
        sync "$D/inbox" "$CLAIMED/$sid"
    fi

    # The session script: $AGENT_STATE_OWNER_PID, else our parent. (The Rust hook
    # also walks up through forked subshells, comparing /proc/PID/exe; a shell
    # cannot readlink without another process, so this baseline does not.)
    local owner_pid=${AGENT_STATE_OWNER_PID:-$PPID} owner_start=null st rest
    local -a fields
    if read -r st 2>/dev/null </proc/$owner_pid/stat; then
        rest=${st##*)}
        read -r -a fields <<<"$rest"
        owner_start=${fields[19]:-null}
    fi

    local common=(--arg now "$now" --arg agent "$agent" --arg sid "$sid" --arg type "$kind"
        --arg model "$model" --arg branch "$branch" --argjson timeout "$timeout"
        --arg rq "$rq" --arg bt "$bt" --arg dt "$dt" --arg msgs "$msgs"
        --argjson pid "$owner_pid" --argjson ostart "$owner_start"
        --argjson se "$se" --arg bad_se "$bad_se" --arg domain "$a_domain" --arg inst "$instance")

    # session.json and report.json staged before the journal line, renamed in after it
    local staged staged_s staged_r
    stage_json "$S" -n "${common[@]}" "$JQ_DEFS"'
        (try input catch {}) | obj as $cur
        | ($cur | session_doc | del(.agent, .session_id, .started_at, .ended_at, .type,
             .domain, .branch, .status, .model, .timeout_seconds, .research_question,
             .belief_targeted, .disconfirmation_target, .sources_archived, .sources_expected,
             .tokens_used, .cost_usd, .errors, .handoff_notes, .pr_number, .reason,
             .owner_pid, .owner_start, .instance, .messages)) as $extra
        | {agent: $agent, session_id: $sid, started_at: $now, ended_at: null, type: $type,
           domain: ($domain | n), branch: ($branch | n), status: "running", model: $model,
           timeout_seconds: $timeout, research_question: ($rq | n),
           belief_targeted: ($bt | n), disconfirmation_target: ($dt | n),
           sources_archived: null, sources_expected: $se, tokens_used: null, cost_usd: null,
           errors: (if $bad_se == "" then [] else [bad_count("--sources-expected"; $bad_se; $now)] end),
           handoff_notes: null, owner_pid: $pid, owner_start: $ostart, instance: ($inst | n),
           messages: ($msgs | split("\n") | map(select(length > 0)))}
          + $extra
        | session_doc' "$(input_of "$S")"
    staged_s=$staged

    stage_json "$R" -n "${common[@]}" "$JQ_DEFS"'
        (try input catch {}) | report_doc
        | .agent = $agent
        | .status = ({"research": "researching", "ad-hoc": "researching",
                      "extract": "extracting", "evaluate": "evaluating"}[$type] // "researching")
        | .current_session = $sid
        | .instance = ($inst | n)
        | .updated_at = $now
        | .lifecycle = "alive"
        | report_doc' "$(input_of "$R")"
    staged_r=$staged

    # The owner lock, taken before the session is recorded as running.
    local owner_lock=$D/sessions/$sid.owner have_owner_lock=0
    [[ -d $D/sessions ]] || mkdir -m 0750 "$D/sessions"
    exec 7<>"$owner_lock"
    if flock -xn 7; then
        have_owner_lock=1
        printf '{"session_id":"%s","owner_pid":%s,"owner_start":%s}\n' "$sid" "$owner_pid" "$owner_start" >&7
    else
        echo "baseline: note: session $sid has no owner lock" >&2
        exec 7<&-
    fi

    journal_append "$(jq -nc "${common[@]}" "$JQ_DEFS"'
        ($msgs | split("\n") | map(select(length > 0))) as $m
        | {ts: $now, event: "session_start", session_id: $sid, type: $type, model: $model}
        + (if $branch == "" then {} else {branch: $branch} end)
        + {timeout_seconds: $timeout}
        + (if $rq == "" then {} else {research_question: $rq} end)
        + (if $dt == "" then {} else {disconfirmation_target: $dt} end)
        + (if $m == [] then {} else {messages: $m} end)
        + {owner_pid: $pid}
        + (if $inst == "" then {} else {instance: $inst} end)')"
    commit_all "$staged_s" "$S" "$staged_r" "$R"

    # metrics.rs apply(): a session start changes a counter only with a
    # disconfirmation target; otherwise an existing metrics.json is not rewritten.
    if [[ -n $dt || ! -e $M ]]; then
        write_json "$M" -n "${common[@]}" "$JQ_DEFS"'
            (try input catch {}) | metrics_doc
            | .agent = $agent
            | (if $dt == "" then . else .lifetime.disconfirmation_attempts += 1 end)
            | .updated_at = $now' "$(input_of "$M")"
    fi

    # The keeper: holds fd 7 (not the agent lock, fd 9, nor fd 8) until the
    # owner exits or the session's end removes the lock file.
    if ((have_owner_lock)) && [[ $owner_start != null ]]; then
        setsid bash -c 'while [[ -e $1 ]] && kill -0 "$2" 2>/dev/null; do sleep 0.05; done' \
            keeper "$owner_lock" "$owner_pid" </dev/null >/dev/null 2>&1 8<&- 9<&- &
    fi
    if ((have_owner_lock)); then exec 7<&-; fi

    printf '%s\n' "$sid"
    [[ -z $bad_se ]] || return 65
}

# ---- end ---------------------------------------------------------------------

end_() {
    local sources='null' bad_sa='' raw branch summary np handoff wanted sid
    if [[ -n ${opt[--sources-archived]+x} ]]; then
        trim "${opt[--sources-archived]}" raw
        if [[ $raw =~ ^[0-9]+$ ]]; then sources=$((10#$raw)); else bad_sa=${opt[--sources-archived]}; fi
    fi
    trim "${opt[--branch]-}" branch
    trim "${opt[--summary]-}" summary
    trim "${opt[--next-priority]-}" np
    trim "${opt[--handoff-notes]-}" handoff
    trim "${opt[--session]-${AGENT_STATE_SESSION_ID-}}" wanted

    read_session
    sid=$cur_id
    if [[ $cur_status == running && -n $wanted && $wanted != "$sid" ]]; then
        die "$agent: session $wanted is not running; the running session is $sid" 66
    fi
    if [[ $cur_status != running && ( -z $wanted || $wanted == "$sid" ) && -n $sid ]]; then
        printf 'agent-state: warning: %s: session %s had already ended (%s); nothing changed\n' \
            "$agent" "$sid" "${cur_status:-unrecorded}" >&2
        return 0
    fi
    [[ $cur_status == running ]] || die "$agent: no session is running, so there is nothing to end" 66

    # the claimed messages: listed now, moved to processed/ after the journal line
    local processed='' flags=0 f name files=()
    if [[ -d $CLAIMED/$sid ]]; then
        files=("$CLAIMED/$sid"/*.json)
        for f in "${files[@]}"; do
            [[ $(jq -r '.type // "flag"' "$f" 2>/dev/null) != flag ]] || flags=$((flags + 1))
            name=${f##*/}
            processed+=${name%.json}$'\n'
        done
    fi

    local common=(--arg now "$now" --arg agent "$agent" --arg sid "$sid"
        --argjson sa "$sources" --arg bad_sa "$bad_sa" --arg branch "$branch"
        --arg summary "$summary" --arg np "$np" --arg handoff "$handoff"
        --arg processed "$processed" --argjson flags "$flags")

    # session.json and report.json staged before the journal line, renamed in after it
    local staged staged_s staged_r
    stage_json "$S" "${common[@]}" "$JQ_DEFS"'
        session_doc
        | .status = "completed"
        | .sources_archived = ($sa // .sources_archived)
        | .branch = (($branch | n) // .branch)
        | .handoff_notes = (($handoff | n) // .handoff_notes)
        | .ended_at = $now
        | del(.owner_pid, .owner_start)
        | .errors = (.errors + (if $bad_sa == "" then []
                                else [bad_count("--sources-archived"; $bad_sa; $now)] end))
        | session_doc' "$S"
    staged_s=$staged

    # Sleeping once it has an identity; hatching until then.
    local lifecycle=hatching
    if [[ -f $D/identity.md || -f $D/prompt.md ]]; then lifecycle=sleeping; fi
    stage_json "$R" -n "${common[@]}" --arg lifecycle "$lifecycle" --slurpfile s "$staged_s" "$JQ_DEFS"'
        $s[0] as $s
        | (try input catch {}) | report_doc
        | .status = "idle"
        | .summary = (($summary | n) // ("Session \($sid) completed"
            + (if $s.sources_archived == null then ""
               else " — \($s.sources_archived) sources archived" end)))
        | (if $np == "" then . else .next_priority = $np end)
        | .agent = $agent
        | del(.current_session)
        | .updated_at = $now
        | .lifecycle = $lifecycle
        | .last_session = ({id: $sid, started_at: $s.started_at, ended_at: $s.ended_at,
                            outcome: "completed", sources_archived: $s.sources_archived,
                            branch: $s.branch, pr_number: $s.pr_number}
                           + ((.last_session // {}) | obj
                              | del(.id, .started_at, .ended_at, .outcome, .sources_archived,
                                    .branch, .pr_number, .reason)))
        | report_doc' "$(input_of "$R")"
    staged_r=$staged

    journal_append "$(jq -c "${common[@]}" "$JQ_DEFS"'
        session_doc as $s
        | ($processed | split("\n") | map(select(length > 0))) as $p
        | {ts: $now, event: "session_end", session_id: $sid, outcome: "completed",
           sources_archived: $sa}
        + (if $handoff == "" then {} else {handoff: $handoff} end)
        + (if $summary == "" then {} else {summary: $summary} end)
        + (if $np == "" then {} else {next_priority: $np} end)
        + ((($branch | n) // $s.branch) as $b | if $b == null then {} else {branch: $b} end)
        + (if $p == [] then {} else {messages_processed: $p} end)
        + (if $flags == 0 then {} else {flags_received: $flags} end)
        + (if $s.started_at == null then {}
           else {duration_seconds: (($now | fromdateiso8601) - ($s.started_at | fromdateiso8601))}
           end)' "$S")"

    # acknowledge: claimed messages → processed/, then remove the claimed dir
    if ((${#files[@]})); then
        mkdir -p -m 2770 "$D/inbox/processed"
        for f in "${files[@]}"; do mv "$f" "$D/inbox/processed/${f##*/}"; done
        sync "$D/inbox/processed" "$CLAIMED/$sid"
    fi
    if [[ -d $CLAIMED/$sid ]] && rmdir "$CLAIMED/$sid" 2>/dev/null; then sync "$CLAIMED"; fi
    # (flag messages would be appended to memory.md here; none in the benchmark)
    # metrics.json staged with the others: three renames, one directory fsync.
    stage_json "$M" -n "${common[@]}" --rawfile journal "$J" "$JQ_DEFS"'
        (try input catch {}) | metrics_doc
        | .agent = $agent
        | (if .counted_session == $sid then .   # an end is counted once
           else .lifetime.sessions_total += 1
              | .lifetime.sessions_completed += 1
              | .lifetime.sources_archived += ($sa // 0)
              | .lifetime.cross_agent_flags_received += $flags
           end)
        | .counted_session = $sid
        | .rolling_30d = (rolling($journal; $now)
                          + (.rolling_30d | delpaths([rolling_keys[] | [.]])))
        | .updated_at = $now
        | metrics_doc' "$(input_of "$M")"
    commit_all "$staged_s" "$S" "$staged_r" "$R" "$staged" "$M"
    rm -f "$D/sessions/$sid.owner"

    printf '%s completed\n' "$sid"
    [[ -z $bad_sa ]] || return 65
}

case $hook in
    begin) begin ;;
    end) end_ ;;
esac
