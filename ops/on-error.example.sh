#!/bin/sh
# An on-error hook for agent-state: install as /etc/agent-state/on-error.sh
# (mode 0755) and set `[hooks] on_error` to that path.
#
# The daemon runs it for every error of medium severity or worse, with:
#   AGENT_STATE_ERROR_CODE      e.g. SESSION_TIMEOUT (docs/errors.md lists them)
#   AGENT_STATE_ERROR_SEVERITY  medium | high | critical
#   AGENT_STATE_ERROR_MESSAGE   one sentence
#   AGENT_STATE_ERROR_DETAILS   more, may be empty
#   AGENT_STATE_ERROR_AGENT     the agent, may be empty (disk errors)
#   AGENT_STATE_ERROR_SESSION   the session id, may be empty
#   AGENT_STATE_ERROR_ATTEMPT   1 for a first attempt, 2 for the first retry, ...
#   AGENT_STATE_ERROR_ESCALATED 1 if it also went to the human mailbox
#   AGENT_STATE_ROOT            the state root
# It runs as the service user, in its own process group, for at most
# `[hooks] timeout`; a failure is logged as HOOK_FAILED and never stops the
# daemon. Keep it quick and quiet.
set -u

summary="agent-state ${AGENT_STATE_ERROR_SEVERITY}: ${AGENT_STATE_ERROR_CODE} ${AGENT_STATE_ERROR_AGENT:+(${AGENT_STATE_ERROR_AGENT}) }${AGENT_STATE_ERROR_MESSAGE}"

# Always: one line to syslog/journal under its own tag.
logger -t agent-state-alert -- "$summary" 2>/dev/null || true

case "$AGENT_STATE_ERROR_SEVERITY" in
critical | high)
    # Page someone. Uncomment what applies here, e.g.:
    # printf '%s\n\n%s\n' "$summary" "$AGENT_STATE_ERROR_DETAILS" | mail -s "$summary" ops@example.org
    # curl -fsS -m 10 -d "text=$summary" https://hooks.example.org/agent-state
    :
    ;;
esac

case "$AGENT_STATE_ERROR_CODE" in
DISK_FULL | DISK_CRITICAL)
    # The daemon already pruned what its retention allows; free more here if
    # something else on this machine is known to be safe to clean.
    :
    ;;
esac
exit 0
