#!/usr/bin/env bash
# One prepared device run (issues 10, 11, 33 and 57): every KV layout of arbor-server beside stock llama-server's split
# and unified KV, on the seed's shape, the agent workload and decode at 1/4/16 streams, with the kernel check, inside
# one call of at most 10 minutes.
#
# On a GPU host prepared as ../shared/device/README.md says, from the project root. Prepare here with
#     EXTRA_WHEELS="prometheus-client h11 anyio sniffio click httpx httpcore idna certifi" \
#         bash ../shared/device/prepare.sh
# (the server needs prometheus-client; the benchmark clients httpx and its dependencies, for hosts without them;
# nothing of the workbench: the agent workload is the harness's own, its replay shows no progress bar), then
# compile here, which saves the host a 4-minute compile (30 minutes on 2 cores, once):
#     bash bench/device_prebuild.sh                  # writes .device/prebuilt.tar.xz
# and carry .device (without llama.cpp.tar.gz and py-spy's wheel: a device call carries at most 64 MiB). On the host,
# in one call:
#     bash bench/device_prebuild.sh --install && bash bench/device_suite.sh   # OUT: default $OUT, else /tmp/device-suite
# (or patch the source here, `bash bench/device_patch.sh`, and build on the host:
#     TARGETS="llama mtmd arbor-chat arbor-spec llama-server llama-bench" bash .device/build.sh llama-1b q8_0).
# Back here, one command puts the figures in docs/benchmarks.md (write bench/results/device/README.md first: what
# ran where):
#     python -m bench.report --device-results PATH/results.tgz
# Elsewhere (its CPU path, a dry run on a machine without a GPU), name the parts; the shapes shrink with NGL=0:
#     MODEL=/tmp/synth.gguf LLAMA_SERVER=~/.cache/arbor/stock/build/bin/llama-server NGL=0 THREADS=2 \
#         bash bench/device_suite.sh /tmp/ds
#
# Steps, most wanted first; each gets what is left of DEADLINE_S (default 480 s, leaving the call's last two minutes
# to the install and the transfer) and the run starts no step with less than a minute left:
#   1. llama-bench: the build's raw prefill and decode speed;
#   2. the paged flash-attention kernels against the dense ones on random data, timed at 4K, 16K and 128K cells
#      (issue 33, bench/paged_kernel_check.py);
#   3. seed 002's shape (8 streams, each its own 16K-token prompt, 8 slots of 16K cells): arbor-server in each KV
#      layout (--kv-layout unified and split; `auto` is split on a GPU) and with paged attention on, against stock
#      llama-server split and unified (issues 33 and 57);
#   4. the agent workload (bench.run_all's agent_branches: 8 sessions x 4 turns x 2 branches, with its ideal computed
#      tokens): arbor-server --no-cache, A,S,H in each layout, llama-server split and unified, the same prompts for
#      every server (issues 10 and 57);
#   5. decode tok/s and TTFT at 1, 4 and 16 streams: arbor-server in each layout against llama-server split and
#      unified (issues 11 and 57);
#   6. paged attention's top-1 agreement with unpaged and what idle KV cells cost (issue 22);
#   7. the cache's host store and restore throughput with the model offloaded (issue 10);
#   8. the kernels' quick grid under compute-sanitizer's memcheck (issue 33).
# Writes OUT/summary.md (bench.report over what finished), OUT/suite.log and OUT/results.tgz (raw JSON and server
# logs): three files, within what a device run sends back.
# STEPS="name ..." runs only the steps named (llama_bench paged_kernel_check seed_shape agent engine_throughput
# paged_agreement idle_cells cache_micro paged_kernel_sanitizer), for a second run that completes a first.
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
# What every step imports: the server's packages and the benchmark clients'; nothing of the workbench's (LangChain,
# LangGraph, SQLModel), which a GPU host without network lacks. The steps' own modules are imported too, so a
# missing package shows here, before any step, not as an empty result.
missing=$("$PY" -c "
import importlib
for m in ('numpy', 'httpx', 'fastapi', 'uvicorn', 'pydantic_settings', 'prometheus_client', 'llama_cpp',
          'server.api.app', 'bench.engine_throughput', 'bench.run_all', 'bench.report', 'bench.paged_kernel_check'):
    try:
        importlib.import_module(m)
    except Exception as exc:
        print(m, repr(exc))
" 2>&1)
if [ -n "$missing" ]; then
  say "missing Python modules (add their packages with EXTRA_WHEELS to ../shared/device/prepare.sh): $missing"
  exit 1
fi
[ -f "$MODEL" ] || { say "no model at $MODEL"; exit 1; }

if [ -x "$LLAMA_BENCH" ]; then
  step llama_bench "$LLAMA_BENCH" -m "$MODEL" -ngl "$NGL" -p 512 -n 128 -r 1 -o md
fi
# issue 33: the paged kernels against the dense ones on random data (the whole grid), timed from 4K to 128K cells
KERNEL_BACKEND=gpu
[ "$NGL" = 0 ] && KERNEL_BACKEND=CPU  # the CPU path of the script
KERNEL_CELLS=4096,16384,131072
KERNEL_ARGS=(--time --cells "$KERNEL_CELLS")
[ "$NGL" = 0 ] && KERNEL_ARGS=(--quick)  # the CPU path: the quick grid, untimed (the CPU kernel is checked by the tests)
step paged_kernel_check "$PY" -m bench.paged_kernel_check --backend "$KERNEL_BACKEND" "${KERNEL_ARGS[@]}" \
  --out "$R/paged_kernel_check.json"
# seed 002's shape, scaled to the model: 8 streams of unique 16K-token prompts on 8 slots; arbor-server in each KV
# layout and with paging on (which takes the unified KV), llama-server split and unified
SEED_CTX=131072; SEED_PROMPT=16000; SEED_TOKENS=128
[ "$NGL" = 0 ] && { SEED_CTX=4096; SEED_PROMPT=300; SEED_TOKENS=16; }
step seed_shape "$PY" -m bench.engine_throughput --model "$MODEL" --n-gpu-layers "$NGL" \
  --threads "$THREADS" --parallel 8 --ctx-size "$SEED_CTX" --streams 8 --prompt-tokens "$SEED_PROMPT" --rounds 1 \
  --repeat 1 --max-tokens "$SEED_TOKENS" --arbor-layouts unified,split --arbor-paged --llama-server "$LLAMA_SERVER" \
  --out "$R/seed_shape_gpu.json"
# the agent workload: sessions x turns x branches with its ideal, the same prompts for every server (the harness's
# workload and client: nothing of the workbench is imported)
AGENT_SIZE=--large
[ "$NGL" = 0 ] && AGENT_SIZE=--quick
step agent "$PY" -m bench.run_all "$AGENT_SIZE" --same-prompts --only agent_branches \
  --model "$MODEL" --n-gpu-layers "$NGL" --threads "$THREADS" --parallel 4 --ctx-size 16384 \
  --configs 'arbor --no-cache' 'arbor A,S,H unified' 'arbor A,S,H split' \
  'llama-server -np 4 (split KV)' 'llama-server -np 4 --kv-unified' --out "$R/run_all"
ET_STREAMS=1,4,16; ET_TOKENS=256
[ "$NGL" = 0 ] && { ET_STREAMS=1,4; ET_TOKENS=16; }
step engine_throughput "$PY" -m bench.engine_throughput --model "$MODEL" --n-gpu-layers "$NGL" \
  --threads "$THREADS" --parallel 4 --ctx-size 16384 --streams "$ET_STREAMS" --rounds 1 --repeat 1 \
  --max-tokens "$ET_TOKENS" --arbor-layouts unified,split --llama-server "$LLAMA_SERVER" \
  --out "$R/engine_throughput.json"
step paged_agreement "$PY" -m bench.paged_agreement --model "$MODEL" --n-gpu-layers "$NGL" \
  --threads "$THREADS" --out "$R/paged_agreement.json"
step idle_cells "$PY" -m bench.idle_cells --model "$MODEL" --n-gpu-layers "$NGL" --threads "$THREADS" \
  --page-size 0,16 --out "$R/idle_cells.json"
step cache_micro "$PY" -m bench.cache_micro --model "$MODEL" --n-gpu-layers "$NGL" --threads "$THREADS" \
  --out "$R/cache_micro.json"
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2> /dev/null || true)
if [ -n "$SANITIZER" ] && [ "$KERNEL_BACKEND" = gpu ]; then
  step paged_kernel_sanitizer timeout 120 "$SANITIZER" --tool memcheck --error-exitcode 9 \
    "$PY" -m bench.paged_kernel_check --backend "$KERNEL_BACKEND" --quick --out "$R/paged_kernel_sanitizer.json"
else
  say "skipped paged_kernel_sanitizer: no GPU, or no compute-sanitizer on PATH or in /usr/local/cuda/bin"
fi

# the summary: bench.report's sections over what finished (the seed's shape, the agent workload, the engine, ...)
"$PY" -m bench.report --results "$R" --out "$OUT/summary.md" >> "$LOG" 2>&1 || say "report failed"
tar czf "$OUT/results.tgz" -C "$OUT" results 2>> "$LOG"
rm -rf "$R"
say "done: $OUT/summary.md, $OUT/suite.log, $OUT/results.tgz"
