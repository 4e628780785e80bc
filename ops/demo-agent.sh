#!/usr/bin/env bash
# demo-agent.sh AGENT — a simulated agent for trying the daemon (config/dev.toml):
# reads the prompt the daemon assembled, prints progress (with the agent
# signals of seed 000: <axiom>PROGRESS:n</axiom>, <axiom>COMPLETE</axiom>),
# appends a line to memory.md, sleeps a little, sometimes fails, and ends with
# a Context Summary Block and a signal block (seed 004). No network, no API key.
set -euo pipefail
agent=${1:?usage: demo-agent.sh AGENT}
prompt_file=${AGENT_STATE_PROMPT_FILE:?run by the agent-state daemon}
dir=${AGENT_STATE_DIR:?run by the agent-state daemon}

lines=$(wc -l < "$prompt_file")
messages=$(grep -c '^## Message ' "$prompt_file" || true)
echo "[$agent] session $AGENT_STATE_SESSION_ID ($AGENT_STATE_INSTANCE): read a prompt of $lines lines, $messages message(s)"
for step in 1 2 3; do
    sleep "${DEMO_STEP_SECONDS:-2}"
    echo "[$agent] working... step $step of 3 <axiom>PROGRESS:$((step * 33))</axiom>"
done
printf -- '- %s (%s): demo session %s read %s message(s)\n' "$(date -u +%F)" "$AGENT_STATE_INSTANCE" \
    "$AGENT_STATE_SESSION_ID" "$messages" >> "$dir/memory.md"
# One session in five fails, so the demo shows failures too.
if [ "${DEMO_FAIL_RATE:-5}" -gt 0 ] && [ $((RANDOM % ${DEMO_FAIL_RATE:-5})) -eq 0 ]; then
    echo "[$agent] simulated failure" >&2
    exit 3
fi
echo "[$agent] done <axiom>COMPLETE</axiom>"
cat <<SUMMARY

## Context Summary

**Goal**: Demo research for $agent
**Current State**: Read a prompt of $lines lines and $messages message(s); noted it in memory.md
**Next Agent**: Judge
**Confidence**: 4
**Risk Level**: low
**Blockers**: None

Agent=Actor | Cycle=$AGENT_STATE_SESSION_ID | Step=3 | Confidence=4 | Risk=low | Next=Judge
SUMMARY
