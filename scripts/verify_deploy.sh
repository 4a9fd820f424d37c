#!/usr/bin/env bash
# Verifies a running Arbor deployment (docker compose), from the directory holding compose.yaml
# and .env (the repository root):
#   1. waits until Docker reports every service healthy (incident-api, server, workbench);
#   2. fetches each service's health endpoint from the host through its published port;
#   3. reads the server's /props: when it asks layers of an accelerator (--n-gpu-layers, which the
#      CUDA and CANN overlays set), at least one layer must be offloaded to a GPU/NPU device; it
#      prints where the layers run and any weight types the device leaves to the CPU;
#   4. runs `arbor verify --base-url http://127.0.0.1:8090 --chat` inside the workbench
#      container (real model and tool calls; the host needs no Python environment).
# Exits 0 only when every step passed; prints one line per check. One deadline covers it all.
#
# Usage: scripts/verify_deploy.sh [--timeout SECONDS] [--no-chat]
#   --timeout   the deadline for the whole check (default 900: a large model's first load on an
#               NPU can take minutes)
#   --no-chat   skip step 4
# Environment: ARBOR_COMPOSE  compose command to use (default: `docker compose`, else `docker-compose`);
#                             container inspection uses the same engine ("sudo docker compose" ->
#                             "sudo docker", "podman-compose" -> "podman")
#              ARBOR_API_KEY  the server's key, when set (else read from ./.env), for /props
#              ARBOR_VERIFY_POLL_S  seconds between health polls (default 5)
set -euo pipefail

timeout_s=900
chat=1
while [ $# -gt 0 ]; do
  case "$1" in
    --timeout) timeout_s=${2:?--timeout needs a number of seconds}; shift 2 ;;
    --no-chat) chat=0; shift ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "verify_deploy: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$timeout_s" in ''|*[!0-9]*) echo "verify_deploy: --timeout must be whole seconds" >&2; exit 2 ;; esac
poll_s=${ARBOR_VERIFY_POLL_S:-5}
deadline=$(( SECONDS + timeout_s ))

# service name, container port, health path
services=(
  "incident-api 8765 /status"
  "server 8080 /health"
  "workbench 8090 /healthz"
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

# The engine's own CLI, for `inspect`: the words of the compose command before "compose"
# ("sudo docker compose" -> "sudo docker"), or a "<engine>-compose" word without its suffix.
docker_cmd=()
for word in "${compose[@]}"; do
  case "$word" in
    compose) break ;;
    *-compose) docker_cmd+=("${word%-compose}"); break ;;
    *) docker_cmd+=("$word") ;;
  esac
done
[ "${#docker_cmd[@]}" -gt 0 ] || docker_cmd=(docker)

fail() { echo "FAIL: $*" >&2; exit 1; }

# Seconds left before the deadline (at least 1, so a last short try still happens).
remaining() { local left=$(( deadline - SECONDS )); echo $(( left > 0 ? left : 1 )); }

# Prints Docker's view of a container: "<state> <health>" (health is "none" without a healthcheck).
container_status() {
  "${docker_cmd[@]}" inspect --format '{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$1"
}

wait_healthy() {
  local service=$1 cid state health
  while :; do
    cid=$("${compose[@]}" ps -q "$service" 2>/dev/null | head -n 1 || true)
    [ -n "$cid" ] || fail "$service: no container (start the deployment: ${compose[*]} up -d)"
    read -r state health <<<"$(container_status "$cid")"
    case "$state/$health" in
      running/healthy) echo "ok: $service is healthy"; return 0 ;;
      running/none) fail "$service: container has no healthcheck" ;;
      running/unhealthy)
        echo "FAIL: $service is unhealthy; last health check output:" >&2
        "${docker_cmd[@]}" inspect --format '{{range .State.Health.Log}}{{.Output}}{{end}}' "$cid" | tail -n 5 >&2 || true
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

# GET a URL (extra arguments: request headers), bounded by the deadline. The headers reach curl
# (or python) on stdin, never on a command line, where any user of the machine could read the API
# key (ps, /proc/PID/cmdline); printf is a shell builtin, so it starts no process either.
http_get() {
  local url=$1 max_s header
  shift
  max_s=$(remaining); [ "$max_s" -le 15 ] || max_s=15
  if command -v curl >/dev/null 2>&1; then
    # curl's config syntax: header = "VALUE", with \ and \" escaped inside the quotes
    for header in "$@"; do
      header=${header//\\/\\\\}
      printf 'header = "%s"\n' "${header//\"/\\\"}"
    done | curl --config - --fail --silent --show-error --max-time "$max_s" "$url"
  else
    printf '%s\n' "$@" | python3 -c 'import sys, urllib.request
headers = dict(h.split(": ", 1) for h in sys.stdin.read().splitlines() if h)
req = urllib.request.Request(sys.argv[1], headers=headers)
sys.stdout.write(urllib.request.urlopen(req, timeout=float(sys.argv[2])).read().decode())' "$url" "$max_s"
  fi
}

# http://HOST:PORT of a service's published container port, reachable from this host.
published_url() {
  local service=$1 port=$2 published
  published=$("${compose[@]}" port "$service" "$port" 2>/dev/null | head -n 1 || true)
  [ -n "$published" ] || fail "$service: port $port is not published"
  # 0.0.0.0:PORT (published on every address) is reachable on loopback.
  published=${published/#0.0.0.0:/127.0.0.1:}
  published=${published/#\[::\]:/127.0.0.1:}
  echo "http://$published"
}

check_endpoint() {
  local service=$1 port=$2 path=$3 url body
  url="$(published_url "$service" "$port")$path"
  body=$(http_get "$url") || fail "$service: GET $url failed"
  echo "ok: GET $url -> ${body:0:200}"
}

# The value of a scalar or flat {..}/[..] field of /props' compact JSON (its keys are unique there).
json_field() {
  printf '%s' "$1" | grep -oE "\"$2\":(\[[^]]*\]|\{[^}]*\}|[^,}]*)" | head -n 1 | cut -d: -f2- || true
}

# Step 3: where the model runs, from arbor.offload of the server's /props.
check_offload() {
  local url key props asked offloaded total fallback devices cpu_types headers=()
  url="$(published_url server 8080)/props"
  key=${ARBOR_API_KEY:-}
  if [ -z "$key" ] && [ -f .env ]; then key=$(sed -n 's/^ARBOR_API_KEY=//p' .env | tail -n 1); fi
  [ -z "$key" ] || headers=("Authorization: Bearer $key")
  props=$(http_get "$url" ${headers[@]+"${headers[@]}"}) || fail "server: GET $url failed (with ARBOR_API_KEY set, export it or keep it in .env)"
  asked=$(json_field "$props" n_gpu_layers)
  [ -n "$asked" ] || fail "server: $url has no arbor.offload (not an arbor-server of this version?)"
  offloaded=$(json_field "$props" layers_offloaded)
  total=$(json_field "$props" layers_total)
  fallback=$(json_field "$props" cpu_fallback)
  devices=$(json_field "$props" offload_devices)
  cpu_types=$(json_field "$props" cpu_weight_types)
  if [ "$asked" = 0 ]; then
    echo "ok: server runs on the CPU (--n-gpu-layers 0: the CPU deployment)"
    return 0
  fi
  if [ "$fallback" = true ] || [ "${offloaded:-0}" = 0 ]; then
    fail "server: --n-gpu-layers $asked but no layer is on a GPU/NPU (0/$total offloaded; started with --allow-cpu-fallback): the device was not opened; see '${compose[*]} logs --tail 100 server' and docs/deploy.md, Troubleshooting"
  fi
  echo "ok: server offloads $offloaded/$total layers to $devices"
  case "$cpu_types" in
    '{}'|null|'') ;;
    *) echo "WARN: weight types the device cannot multiply run on the CPU: $cpu_types (see arbor.offload.warnings in $url)" >&2 ;;
  esac
}

for entry in "${services[@]}"; do
  read -r service port path <<<"$entry"
  wait_healthy "$service"
done
for entry in "${services[@]}"; do
  read -r service port path <<<"$entry"
  check_endpoint "$service" "$port" "$path"
done
check_offload

if [ "$chat" = 1 ]; then
  echo "running: arbor verify --chat inside the workbench container"
  # bounded by what is left of the deadline where coreutils' timeout exists
  limit=()
  if command -v timeout >/dev/null 2>&1; then limit=(timeout "$(remaining)"); fi
  ${limit[@]+"${limit[@]}"} "${compose[@]}" exec -T workbench arbor verify --base-url http://127.0.0.1:8090 --chat \
    || fail "arbor verify --chat failed or passed the deadline (output above)"
  echo "ok: arbor verify --chat"
fi
echo "deployment verified"
