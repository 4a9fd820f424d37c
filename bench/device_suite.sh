#!/usr/bin/env bash
# The GPU-host measurements of issues 10, 11 and 33 in one run, within a deadline.
#
# On a GPU host prepared as ../shared/device/README.md says, from the project root. Prepare here with
#     EXTRA_WHEELS="prometheus-client tqdm h11 anyio sniffio click httpx httpcore idna certifi" \
#         bash ../shared/device/prepare.sh
# (the server needs prometheus-client, the replay client tqdm; the rest is for hosts without them), then
# either compile here, which saves the host a 4-minute compile (30 minutes on 2 cores, once):
#     bash bench/device_prebuild.sh                  # writes .device/prebuilt.tar.xz
# and on the host run `bash bench/device_prebuild.sh --install` (carry .device without llama.cpp.tar.gz and py-spy's
# wheel, which it does not need: a device call carries at most 64 MiB), or patch the source here
# (`bash bench/device_patch.sh`) and compile on the host:
#     TARGETS="llama mtmd arbor-chat arbor-spec llama-server llama-bench" bash .device/build.sh llama-1b q8_0
# Either way the host gets our llama.cpp patches (paged attention, CUDA's kernels included). Then:
#     bash bench/device_suite.sh [OUT]          # OUT: default $OUT, else /tmp/device-suite
# Elsewhere (to try the script on a CPU), name the parts:
#     MODEL=/tmp/synth.gguf LLAMA_SERVER=/path/llama-server NGL=0 THREADS=2 bash bench/device_suite.sh /tmp/ds
#
# Steps, most wanted first; each gets what is left of DEADLINE_S (default 480 s) and the run stops
# starting new ones when less than a minute is left:
#   1. llama-bench: the build's raw prefill and decode speed;
#   2. the paged flash-attention kernels (decode, and the prefill through the MMA gather) against the dense ones
#      on random data, timed from 4K to 128K cells, then their quick grid under compute-sanitizer's memcheck
#      (issue 33, bench/paged_kernel_check.py);
#   3. seed 002's shape (8 streams, each its own 16K-token prompt, 8 slots of 16K cells): arbor-server with
#      paged attention on and as auto leaves it, against stock llama-server split and unified (issue 33);
#   4. decode tok/s and TTFT at 1, 4 and 16 streams: arbor-server against stock llama-server
#      (split and unified KV), same flags (issue 11);
#   5. paged attention (issue 22): CUDA's paged kernel against the dense one (top-1 agreement on a
#      scripted workload), then what idle KV cells (kept prefixes) cost the running requests'
#      steps on this backend, unpaged and paged;
#   6. the large agent and shared-prefix workloads, same prompts for every server, every cache
#      configuration against --no-cache and llama-server (issue 10);
#   7. host store and restore throughput with the model offloaded (issue 10).
# Writes OUT/summary.md (bench.report over what finished), OUT/suite.log and OUT/results.tgz
# (raw JSON and server logs): three files, within what a device run sends back.
# STEPS="name ..." runs only the steps named (llama_bench paged_kernel_check paged_kernel_sanitizer seed_shape
# engine_throughput paged_agreement idle_cells run_all cache_micro), for a second run that completes a first.
set -uo pipefail
OUT=${1:-${OUT:-/tmp/device-suite}}
R=$OUT/results
mkdir -p "$R"
START=$(date +%s)
DEADLINE_S=${DEADLINE_S:-480}
MODEL=${MODEL:-/tmp/w/model.gguf}
LLAMA_SERVER=${LLAMA_SERVER:-/tmp/w/build/bin/llama-server}
LLAMA_BENCH=${LLAMA_BENCH:-$(dirname "$LLAMA_SERVER")/llama-bench}
NGL=${NGL:-999}
THREADS=${THREADS:-8}
PY=${PYTHON:-python3}
if [ -d /tmp/site ]; then  # the layout .device/build.sh installs
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
  export LD_LIBRARY_PATH=/tmp/site/llama_cpp/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # cuBLAS where bench/device_prebuild.sh --install found it (the prebuilt libraries were linked elsewhere)
  [ -s /tmp/w/cuda_lib_dir ] && LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(cat /tmp/w/cuda_lib_dir)
  export PATH=/tmp/site/bin:$PATH
fi
export LLAMA_SERVER
LOG=$OUT/suite.log
: > "$LOG"

say() { echo "[$(($(date +%s) - START)) s] $*" | tee -a "$LOG"; }
left() { echo $((DEADLINE_S - ($(date +%s) - START))); }
step() {  # step NAME CMD...: run with what is left of the deadline, log its tail
  local name=$1; shift
  if [ -n "${STEPS:-}" ] && [[ " $STEPS " != *" $name "* ]]; then say "skipped $name: not in STEPS"; return; fi
  local budget; budget=$(left)
  if [ "$budget" -lt 60 ]; then say "skipped $name: ${budget} s left"; return; fi
  say "start $name (at most ${budget} s)"
  timeout "$budget" "$@" > "$R/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$R/$name.log" >> "$LOG"
  say "end $name: rc=$rc"
}

say "model $MODEL, llama-server $LLAMA_SERVER, n-gpu-layers $NGL, threads $THREADS, deadline ${DEADLINE_S} s"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$LOG" 2>&1
missing=$("$PY" -c "
import importlib
for m in ('numpy', 'httpx', 'jinja2', 'fastapi', 'uvicorn', 'pydantic_settings', 'prometheus_client', 'tqdm', 'llama_cpp'):
    try:
        importlib.import_module(m)
    except Exception as exc:
        print(m, exc)
" 2>&1)
if [ -n "$missing" ]; then
  say "missing Python modules (add them with EXTRA_WHEELS to ../shared/device/prepare.sh): $missing"
  exit 1
fi
[ -f "$MODEL" ] || { say "no model at $MODEL"; exit 1; }

if [ -x "$LLAMA_BENCH" ]; then
  step llama_bench "$LLAMA_BENCH" -m "$MODEL" -ngl "$NGL" -p 512 -n 128 -r 2 -o md
fi
# issue 33: the paged kernels against the dense ones on random data (the whole grid), both timed from 4K to 128K
# cells; then the quick grid under compute-sanitizer's memcheck (first run: 2026-12-04, an H200)
KERNEL_BACKEND=gpu
[ "$NGL" = 0 ] && KERNEL_BACKEND=CPU  # trying the script on a CPU
KERNEL_CELLS=4096,8192,16384,32768,65536,131072
[ "$NGL" = 0 ] && KERNEL_CELLS=4096,8192
step paged_kernel_check "$PY" -m bench.paged_kernel_check --backend "$KERNEL_BACKEND" --time --cells "$KERNEL_CELLS" --out "$R/paged_kernel_check.json"
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2> /dev/null || true)
if [ -n "$SANITIZER" ] && [ "$KERNEL_BACKEND" = gpu ]; then
  step paged_kernel_sanitizer timeout 120 "$SANITIZER" --tool memcheck --error-exitcode 9 \
    "$PY" -m bench.paged_kernel_check --backend "$KERNEL_BACKEND" --quick --out "$R/paged_kernel_sanitizer.json"
else
  say "skipped paged_kernel_sanitizer: no GPU, or no compute-sanitizer on PATH or in /usr/local/cuda/bin"
fi
# seed 002's shape, scaled to the model: 8 streams of unique 16K-token prompts on 8 slots; on a GPU `auto`
# leaves paged attention off, so arbor-server runs both ways
SEED_CTX=131072; SEED_PROMPT=16000
[ "$NGL" = 0 ] && { SEED_CTX=8192; SEED_PROMPT=900; }
step seed_shape "$PY" -m bench.engine_throughput --model "$MODEL" --n-gpu-layers "$NGL" \
  --threads "$THREADS" --parallel 8 --ctx-size "$SEED_CTX" --streams 8 --prompt-tokens "$SEED_PROMPT" --rounds 1 \
  --repeat 1 --max-tokens 128 --arbor-paged --llama-server "$LLAMA_SERVER" --out "$R/seed_shape_gpu.json"
step engine_throughput "$PY" -m bench.engine_throughput --model "$MODEL" --n-gpu-layers "$NGL" \
  --threads "$THREADS" --parallel 4 --ctx-size 16384 --streams 1,4,16 --rounds 1 --repeat 1 \
  --max-tokens 256 --llama-server "$LLAMA_SERVER" --out "$R/engine_throughput.json"
step paged_agreement "$PY" -m bench.paged_agreement --model "$MODEL" --n-gpu-layers "$NGL" \
  --threads "$THREADS" --out "$R/paged_agreement.json"
step idle_cells "$PY" -m bench.idle_cells --model "$MODEL" --n-gpu-layers "$NGL" --threads "$THREADS" \
  --page-size 0,16 --out "$R/idle_cells.json"
# the workloads drive the workbench's agents, whose packages (LangChain, LangGraph) a GPU host without network lacks
if "$PY" -c "import langchain_core, langgraph" 2> /dev/null; then
  step run_all "$PY" -m bench.run_all --large --same-prompts --only agent_sessions,shared_prefix \
    --model "$MODEL" --n-gpu-layers "$NGL" --threads "$THREADS" --parallel 4 --ctx-size 16384 \
    --configs 'arbor --no-cache' 'arbor A' 'arbor A,S' 'arbor A,H' 'arbor A,S,H' 'arbor A,S,H idle-cells 0' \
    'arbor A,S,H paged' \
    'llama-server -np 4 (split KV)' 'llama-server -np 4 --kv-unified' --out "$R/run_all"
else
  say "skipped run_all: the workbench's packages (langchain-core, langgraph) are not installed here"
fi
step cache_micro "$PY" -m bench.cache_micro --model "$MODEL" --n-gpu-layers "$NGL" --threads "$THREADS" \
  --out "$R/cache_micro.json"

"$PY" -m bench.report --results "$R" --out "$OUT/summary.md" >> "$LOG" 2>&1 || say "report failed"
tar czf "$OUT/results.tgz" -C "$OUT" results 2>> "$LOG"
rm -rf "$R"
say "done: $OUT/summary.md, $OUT/suite.log, $OUT/results.tgz"
