#!/usr/bin/env bash
# Verifies a running Arbor deployment (docker compose), from the directory holding compose.yaml
# and .env (the repository root):
#   1. waits until Docker reports every service healthy (incident-api, server, workbench);
#   2. fetches each service's health endpoint from the host through its published port;
#   3. runs `arbor verify --base-url http://127.0.0.1:8090 --chat` inside the workbench
#      container (real model and tool calls; the host needs no Python environment).
# Exits 0 only when every step passed; prints one line per check.
#
# Usage: scripts/verify_deploy.sh [--timeout SECONDS] [--no-chat]
#   --timeout   how long to wait for the services to become healthy (default 900: a large
#               model's first load on an NPU can take minutes)
#   --no-chat   skip step 3 (health only)
# Environment: ARBOR_COMPOSE  compose command to use (default: `docker compose`, else `docker-compose`)
#              ARBOR_VERIFY_POLL_S  seconds between health polls (default 5)
set -euo pipefail

timeout_s=900
chat=1
while [ $# -gt 0 ]; do
  case "$1" in
    --timeout) timeout_s=${2:?--timeout needs a number of seconds}; shift 2 ;;
    --no-chat) chat=0; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "verify_deploy: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$timeout_s" in ''|*[!0-9]*) echo "verify_deploy: --timeout must be whole seconds" >&2; exit 2 ;; esac
poll_s=${ARBOR_VERIFY_POLL_S:-5}

# service name, container port, health path
services=(
  "incident-api 8765 /status"
  "server 8080 /health"
  "workbench 8090 /api/health"
)

if [ -n "${ARBOR_COMPOSE:-}" ]; then
  read -ra compose <<<"$ARBOR_COMPOSE"
elif docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
  compose=(docker-compose)
else
  echo "FAIL: neither 'docker compose' nor 'docker-compose' is available" >&2
  exit 1
fi

fail() { echo "FAIL: $*" >&2; exit 1; }

# Prints Docker's view of a container: "<state> <health>" (health is "none" without a healthcheck).
container_status() {
  docker inspect --format '{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$1"
}

wait_healthy() {
  local service=$1 deadline=$(( SECONDS + timeout_s )) cid state health
  while :; do
    cid=$("${compose[@]}" ps -q "$service" 2>/dev/null | head -n 1 || true)
    [ -n "$cid" ] || fail "$service: no container (start the deployment: ${compose[*]} up -d)"
    read -r state health <<<"$(container_status "$cid")"
    case "$state/$health" in
      running/healthy) echo "ok: $service is healthy"; return 0 ;;
      running/none) fail "$service: container has no healthcheck" ;;
      running/unhealthy)
        echo "FAIL: $service is unhealthy; last health check output:" >&2
        docker inspect --format '{{range .State.Health.Log}}{{.Output}}{{end}}' "$cid" | tail -n 5 >&2 || true
        fail "$service: see '${compose[*]} logs --tail 100 $service'" ;;
      running/*|created/*|restarting/*) ;;
      *) fail "$service: container is $state; see '${compose[*]} logs --tail 100 $service'" ;;
    esac
    if [ "$SECONDS" -ge "$deadline" ]; then
      fail "$service: still $health after ${timeout_s}s; see '${compose[*]} logs --tail 100 $service'"
    fi
    sleep "$poll_s"
  done
}

http_get() {
  if command -v curl >/dev/null 2>&1; then
    curl --fail --silent --show-error --max-time 15 "$1"
  else
    python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=15).read().decode())' "$1"
  fi
}

check_endpoint() {
  local service=$1 port=$2 path=$3 published url body
  published=$("${compose[@]}" port "$service" "$port" 2>/dev/null | head -n 1 || true)
  [ -n "$published" ] || fail "$service: port $port is not published"
  # 0.0.0.0:PORT (published on every address) is reachable on loopback.
  published=${published/#0.0.0.0:/127.0.0.1:}
  published=${published/#\[::\]:/127.0.0.1:}
  url="http://$published$path"
  body=$(http_get "$url") || fail "$service: GET $url failed"
  echo "ok: GET $url -> ${body:0:200}"
}

for entry in "${services[@]}"; do
  read -r service port path <<<"$entry"
  wait_healthy "$service"
done
for entry in "${services[@]}"; do
  read -r service port path <<<"$entry"
  check_endpoint "$service" "$port" "$path"
done

if [ "$chat" = 1 ]; then
  echo "running: arbor verify --chat inside the workbench container"
  "${compose[@]}" exec -T workbench arbor verify --base-url http://127.0.0.1:8090 --chat \
    || fail "arbor verify --chat failed (output above)"
  echo "ok: arbor verify --chat"
fi
echo "deployment verified"
