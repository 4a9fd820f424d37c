# Arbor images. Targets:
#   server-cpu    inference server, llama.cpp CPU build (x86-64 without AMX, or ARM64)
#   server-cuda   inference server, llama.cpp CUDA build (NVIDIA)
#   server-cann   inference server, llama.cpp CANN build (Ascend NPU, ARM64 or x86-64)
#   workbench     the agent workbench (`arbor serve`); also runs the simulated incident service
# compose.yaml builds them (docs/deploy.md); by hand, e.g.
#   docker build --target server-cpu -t arbor-server:cpu .
#
# Every image runs the source tree at /app from a virtual environment at /opt/venv as the
# non-root user `arbor` (uid 10001). No model weights and no secrets go into any image:
# the GGUF file is mounted read-only at /models, API keys come from the environment at run
# time, and .dockerignore keeps .env and *.gguf out of the build context.
#
# Syntax is kept to what Docker's classic builder understands (no heredocs, COPY --chmod or
# RUN --mount), because Ascend hosts often run a distribution's older Docker packages.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_VERSION=12.6.3
ARG CUDA_UBUNTU=ubuntu24.04
ARG CANN_BASE_IMAGE=quay.io/ascend/cann:8.5.0-910b-ubuntu22.04-py3.11

# ---------------------------------------------------------------------------------------------
# files: what every other stage shares: the dependency list without llama-cpp-python (each
# server target builds that itself, with its backend's flags) and the container entrypoint.
FROM ${PYTHON_IMAGE} AS files
WORKDIR /build
COPY pyproject.toml ./
# The workbench never imports llama_cpp, and the server stages install it first with their
# own CMAKE_ARGS, so the shared list leaves it out.
RUN python -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; print('\n'.join(d for d in deps if not d.replace('_', '-').lower().startswith('llama-cpp-python')))" > requirements.txt \
 && test -s requirements.txt
# The entrypoint loads an accelerator environment script (CANN's set_env.sh) when
# ARBOR_ENV_SCRIPT names one, copies the service's output into ARBOR_LOG_FILE (on the logs
# volume, so logs outlive the container) while keeping it on stdout for `docker compose
# logs`, and execs the command so that it receives the stop signal itself.
# hadolint ignore=SC2016
RUN printf '%s\n' \
      '#!/bin/bash' \
      'if [ -n "${ARBOR_ENV_SCRIPT:-}" ]; then' \
      '  . "$ARBOR_ENV_SCRIPT" || { echo "arbor-entrypoint: cannot load $ARBOR_ENV_SCRIPT" >&2; exit 1; }' \
      'fi' \
      'if [ -n "${ARBOR_LOG_FILE:-}" ] && mkdir -p "$(dirname "$ARBOR_LOG_FILE")"; then' \
      '  exec > >(tee -a "$ARBOR_LOG_FILE") 2>&1' \
      'fi' \
      'exec "$@"' \
      > /usr/local/bin/arbor-entrypoint \
 && chmod 0755 /usr/local/bin/arbor-entrypoint

# ---------------------------------------------------------------------------------------------
# build-cpu: llama-cpp-python for CPUs. x86-64 gets explicit instruction sets with
# GGML_NATIVE=OFF, never AMX: a native build enables AMX where the build machine reports
# it, and AMX faults where the kernel or sandbox does not enable it (DEVELOPERS.md).
FROM ${PYTHON_IMAGE} AS build-cpu
ARG TARGETARCH
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG LLAMA_CPP_PYTHON_SPEC="llama-cpp-python>=0.3.36,<0.4"
ARG CPU_CMAKE_ARGS_AMD64="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
ARG CPU_CMAKE_ARGS_ARM64="-DGGML_NATIVE=OFF"
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# TARGETARCH is empty under the classic builder; the build container's own arch is the target then.
# The llama-cpp-python range comes from pyproject (kept in sync by a test).
# hadolint ignore=DL3013
RUN arch="${TARGETARCH:-$(uname -m)}" \
 && case "$arch" in \
      amd64|x86_64) cpu_args="$CPU_CMAKE_ARGS_AMD64" ;; \
      arm64|aarch64) cpu_args="$CPU_CMAKE_ARGS_ARM64" ;; \
      *) echo "server-cpu: unsupported architecture $arch" >&2; exit 1 ;; \
    esac \
 && echo "llama-cpp-python CMAKE_ARGS: $cpu_args" \
 && CMAKE_ARGS="$cpu_args" pip install --no-cache-dir --index-url "$PIP_INDEX_URL" "$LLAMA_CPP_PYTHON_SPEC"
COPY --from=files /build/requirements.txt /tmp/requirements.txt
RUN pip install --no-cache-dir --index-url "$PIP_INDEX_URL" -r /tmp/requirements.txt
WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir --no-deps -e /app

# server-cpu: slim runtime, only the venv and the source tree.
FROM ${PYTHON_IMAGE} AS server-cpu
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 arbor \
 && useradd --system --uid 10001 --gid arbor --create-home --home-dir /home/arbor --shell /usr/sbin/nologin arbor \
 && mkdir -p /models /var/lib/arbor/cache /var/log/arbor \
 && chown arbor:arbor /var/lib/arbor/cache /var/log/arbor
COPY --from=files /usr/local/bin/arbor-entrypoint /usr/local/bin/arbor-entrypoint
COPY --from=build-cpu /opt/venv /opt/venv
COPY --from=build-cpu /app /app
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /app
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/arbor-entrypoint"]
CMD ["arbor-server", "--host", "0.0.0.0", "--port", "8080"]

# ---------------------------------------------------------------------------------------------
# build-cuda: llama-cpp-python with GGML_CUDA on NVIDIA's devel image. The driver library
# (libcuda) only exists at run time, hence --allow-shlib-undefined.
FROM nvidia/cuda:${CUDA_VERSION}-devel-${CUDA_UBUNTU} AS build-cuda
ARG TARGETARCH
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG LLAMA_CPP_PYTHON_SPEC="llama-cpp-python>=0.3.36,<0.4"
ARG CPU_CMAKE_ARGS_AMD64="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
ARG CPU_CMAKE_ARGS_ARM64="-DGGML_NATIVE=OFF"
ARG CUDA_ARCHITECTURES="80;86;89;90"
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-venv python3-dev build-essential cmake \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# The llama-cpp-python range comes from pyproject (kept in sync by a test).
# hadolint ignore=DL3013
RUN arch="${TARGETARCH:-$(uname -m)}" \
 && case "$arch" in \
      amd64|x86_64) cpu_args="$CPU_CMAKE_ARGS_AMD64" ;; \
      arm64|aarch64) cpu_args="$CPU_CMAKE_ARGS_ARM64" ;; \
      *) echo "server-cuda: unsupported architecture $arch" >&2; exit 1 ;; \
    esac \
 && cmake_args="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHITECTURES $cpu_args -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined" \
 && echo "llama-cpp-python CMAKE_ARGS: $cmake_args" \
 && CMAKE_ARGS="$cmake_args" pip install --no-cache-dir --index-url "$PIP_INDEX_URL" "$LLAMA_CPP_PYTHON_SPEC"
COPY --from=files /build/requirements.txt /tmp/requirements.txt
RUN pip install --no-cache-dir --index-url "$PIP_INDEX_URL" -r /tmp/requirements.txt
WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir --no-deps -e /app

# server-cuda: NVIDIA's runtime image (CUDA runtime + cuBLAS), the venv and the source tree.
FROM nvidia/cuda:${CUDA_VERSION}-runtime-${CUDA_UBUNTU} AS server-cuda
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 libgomp1 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 arbor \
 && useradd --system --uid 10001 --gid arbor --create-home --home-dir /home/arbor --shell /usr/sbin/nologin arbor \
 && mkdir -p /models /var/lib/arbor/cache /var/log/arbor \
 && chown arbor:arbor /var/lib/arbor/cache /var/log/arbor
COPY --from=files /usr/local/bin/arbor-entrypoint /usr/local/bin/arbor-entrypoint
COPY --from=build-cuda /opt/venv /opt/venv
COPY --from=build-cuda /app /app
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
WORKDIR /app
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/arbor-entrypoint"]
CMD ["arbor-server", "--host", "0.0.0.0", "--port", "8080"]

# ---------------------------------------------------------------------------------------------
# build-cann: llama-cpp-python with GGML_CANN on a CANN 8.x toolkit image (ARM64 or x86-64;
# Ubuntu- or openEuler-based). CANN_ENV is the toolkit's set_env.sh inside that image;
# SOC_TYPE names the chip because the build cannot ask npu-smi (no device at build time).
# The driver's libascend_hal only exists at run time: the toolkit's stub satisfies the link.
FROM ${CANN_BASE_IMAGE} AS build-cann
ARG TARGETARCH
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG LLAMA_CPP_PYTHON_SPEC="llama-cpp-python>=0.3.36,<0.4"
ARG CPU_CMAKE_ARGS_AMD64="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
ARG CPU_CMAKE_ARGS_ARM64="-DGGML_NATIVE=OFF"
ARG CANN_ENV=/usr/local/Ascend/ascend-toolkit/set_env.sh
ARG SOC_TYPE=Ascend910B3
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# CANN images normally ship gcc, g++, make and cmake; install them only where one is missing.
# hadolint ignore=DL3008,DL3032,DL3033,DL3041
RUN if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null; then \
      if command -v apt-get >/dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends build-essential cmake && rm -rf /var/lib/apt/lists/*; \
      else \
        yum install -y gcc gcc-c++ make cmake && yum clean all; \
      fi; \
    fi
RUN test -f "$CANN_ENV" || { echo "server-cann: CANN_ENV=$CANN_ENV does not exist in CANN_BASE_IMAGE; pass --build-arg CANN_ENV=<path of set_env.sh>" >&2; exit 1; }
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# The llama-cpp-python range comes from pyproject (kept in sync by a test).
# hadolint ignore=DL3013,SC1090
RUN arch="${TARGETARCH:-$(uname -m)}" \
 && case "$arch" in \
      amd64|x86_64) cpu_args="$CPU_CMAKE_ARGS_AMD64" ;; \
      arm64|aarch64) cpu_args="$CPU_CMAKE_ARGS_ARM64" ;; \
      *) echo "server-cann: unsupported architecture $arch" >&2; exit 1 ;; \
    esac \
 && . "$CANN_ENV" \
 && export LD_LIBRARY_PATH="${ASCEND_TOOLKIT_HOME:-/usr/local/Ascend/ascend-toolkit/latest}/runtime/lib64/stub:${LD_LIBRARY_PATH:-}" \
 && cmake_args="-DGGML_CANN=on -DSOC_TYPE=$SOC_TYPE $cpu_args -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined" \
 && echo "llama-cpp-python CMAKE_ARGS: $cmake_args" \
 && CMAKE_ARGS="$cmake_args" pip install --no-cache-dir --index-url "$PIP_INDEX_URL" "$LLAMA_CPP_PYTHON_SPEC"
COPY --from=files /build/requirements.txt /tmp/requirements.txt
RUN pip install --no-cache-dir --index-url "$PIP_INDEX_URL" -r /tmp/requirements.txt
WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir --no-deps -e /app

# server-cann: the CANN runtime libraries and operator kernels are needed at run time, so this
# stage starts from the same CANN image (no slimmer official runtime image exists for it);
# only the venv and the source tree are added. The driver comes from the host (compose mounts).
FROM ${CANN_BASE_IMAGE} AS server-cann
ARG CANN_ENV=/usr/local/Ascend/ascend-toolkit/set_env.sh
RUN groupadd --system --gid 10001 arbor \
 && useradd --system --uid 10001 --gid arbor --create-home --home-dir /home/arbor --shell /sbin/nologin arbor \
 && mkdir -p /models /var/lib/arbor/cache /var/log/arbor \
 && chown arbor:arbor /var/lib/arbor/cache /var/log/arbor
COPY --from=files /usr/local/bin/arbor-entrypoint /usr/local/bin/arbor-entrypoint
COPY --from=build-cann /opt/venv /opt/venv
COPY --from=build-cann /app /app
# ARBOR_ENV_SCRIPT: the entrypoint sources set_env.sh, as the CANN image's own entrypoint
# (replaced here) did. CANN writes its process logs under ASCEND_PROCESS_LOG_PATH.
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    ARBOR_ENV_SCRIPT=${CANN_ENV} \
    ASCEND_PROCESS_LOG_PATH=/var/log/arbor/ascend
WORKDIR /app
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/arbor-entrypoint"]
CMD ["arbor-server", "--host", "0.0.0.0", "--port", "8080"]

# ---------------------------------------------------------------------------------------------
# build-workbench: the workbench and the incident service need no llama.cpp at all.
FROM ${PYTHON_IMAGE} AS build-workbench
ARG PIP_INDEX_URL=https://pypi.org/simple
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY --from=files /build/requirements.txt /tmp/requirements.txt
RUN pip install --no-cache-dir --index-url "$PIP_INDEX_URL" -r /tmp/requirements.txt
WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir --no-deps -e /app

# workbench: `arbor serve` by default; compose runs the incident service from it as well.
FROM ${PYTHON_IMAGE} AS workbench
RUN groupadd --system --gid 10001 arbor \
 && useradd --system --uid 10001 --gid arbor --create-home --home-dir /home/arbor --shell /usr/sbin/nologin arbor \
 && mkdir -p /data /var/log/arbor \
 && chown arbor:arbor /data /var/log/arbor
COPY --from=files /usr/local/bin/arbor-entrypoint /usr/local/bin/arbor-entrypoint
COPY --from=build-workbench /opt/venv /opt/venv
COPY --from=build-workbench /app /app
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    ARBOR_HOST=0.0.0.0 ARBOR_PORT=8090 ARBOR_DATA_DIR=/data
WORKDIR /app
USER 10001:10001
EXPOSE 8090 8765
ENTRYPOINT ["/usr/local/bin/arbor-entrypoint"]
CMD ["arbor", "serve"]
