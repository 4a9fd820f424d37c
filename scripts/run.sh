#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), then runs the whole product on this machine:
#   arbor-server   on 127.0.0.1:${ARBOR_SERVER_PORT:-8080}  (the embedded model unless ARBOR_MODEL is set)
#   arbor-incident on 127.0.0.1:${ARBOR_INCIDENT_PORT:-8765} (the simulated event service, state degraded)
#   arbor serve    on 127.0.0.1:${ARBOR_PORT:-8090}          (the workbench: open it in a browser)
# Ctrl-C stops all three.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. .venv/bin/activate

SERVER_PORT=${ARBOR_SERVER_PORT:-8080}
INCIDENT_PORT=${ARBOR_INCIDENT_PORT:-8765}
WORKBENCH_PORT=${ARBOR_PORT:-8090}
mkdir -p var/logs

pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

model_args=()
if [ -n "${ARBOR_MODEL:-}" ]; then model_args=(--model "$ARBOR_MODEL"); fi
arbor-server --port "$SERVER_PORT" "${model_args[@]}" --cache-dir var/kv-cache --cache-tiers A,S,H,D \
  >var/logs/server.log 2>&1 &
pids+=($!)
arbor-incident --state "${INCIDENT_STATE:-degraded}" --port "$INCIDENT_PORT" >var/logs/incident.log 2>&1 &
pids+=($!)

echo "waiting for arbor-server on :$SERVER_PORT (log: var/logs/server.log)"
for _ in $(seq 1 120); do
  if curl -fsS "http://127.0.0.1:$SERVER_PORT/health" >/dev/null 2>&1; then break; fi
  if ! kill -0 "${pids[0]}" 2>/dev/null; then echo "arbor-server exited; see var/logs/server.log" >&2; exit 1; fi
  sleep 1
done

export LLM_BASE_URL="http://127.0.0.1:$SERVER_PORT/v1"
export INCIDENT_BASE_URL="http://127.0.0.1:$INCIDENT_PORT"
export ARBOR_DATA_DIR="${ARBOR_DATA_DIR:-var}"
export ARBOR_PORT="$WORKBENCH_PORT"
# The workbench asks for its operator token (generated into $ARBOR_DATA_DIR/workbench-token on
# the first run); this link signs the browser in.
echo "workbench: open $(arbor token)"
arbor serve --port "$WORKBENCH_PORT"
