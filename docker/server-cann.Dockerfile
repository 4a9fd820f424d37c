# arbor-server on Ascend NPUs (CANN 8.x; ARM64 or x86-64; Ubuntu- or openEuler-based CANN images).
# compose.cann.yaml builds it; by hand, from the repository root:
#   docker build -f docker/server-cann.Dockerfile -t arbor-server:cann .
# Atlas 300I Duo (310P), e.g.:
#   docker build -f docker/server-cann.Dockerfile -t arbor-server:cann \
#     --build-arg CANN_BASE_IMAGE=quay.io/ascend/cann:8.5.0-310p-ubuntu22.04-py3.11 --build-arg SOC_TYPE=Ascend310P3 .
# Names only the CANN image: building this server image needs no other base image (the workbench
# image needs python:3.11-slim-bookworm; docs/deploy.md, "Offline host: every image it needs").

ARG CANN_BASE_IMAGE=quay.io/ascend/cann:8.5.0-910b-ubuntu22.04-py3.11

# build: llama.cpp's libraries with GGML_CANN, the bindings, the dependencies and the source tree,
# in a virtual environment at /opt/venv. CANN_ENV is the toolkit's set_env.sh in that image; SOC_TYPE
# names the chip, since the build cannot ask npu-smi (no device at build time).
FROM ${CANN_BASE_IMAGE} AS build
ARG TARGETARCH
ARG PIP_INDEX_URL=https://pypi.org/simple
# The exact llama-cpp-python pin: pyproject.toml and patches/llama-cpp-python.version (kept equal by a test).
ARG LLAMA_CPP_PYTHON_SPEC="llama-cpp-python==0.3.36"
ARG CPU_CMAKE_ARGS=
# Parallel compile jobs; empty: every core (lower it when the build runs out of memory).
ARG BUILD_JOBS=
ARG CANN_ENV=/usr/local/Ascend/ascend-toolkit/set_env.sh
ARG SOC_TYPE=Ascend910B3
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# CANN images normally ship gcc, g++, make and cmake; install them only where one is missing.
# hadolint ignore=DL3008,DL3032,DL3033,DL3041
RUN if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null || ! command -v git >/dev/null; then \
      if command -v apt-get >/dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends build-essential cmake git && rm -rf /var/lib/apt/lists/*; \
      else \
        yum install -y gcc gcc-c++ make cmake git && yum clean all; \
      fi; \
    fi
RUN test -f "$CANN_ENV" || { echo "server-cann: CANN_ENV=$CANN_ENV does not exist in CANN_BASE_IMAGE; pass --build-arg CANN_ENV=<path of set_env.sh>" >&2; exit 1; }
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY docker/build-llama-cpp.sh docker/check-llama-cpp.sh scripts/llama-cpp-source.sh /opt/arbor/
COPY patches /opt/arbor/patches
COPY native /opt/arbor/native
# The driver's libascend_hal.so (and the few driver libraries beside it) come from the host at run
# time (compose mounts the driver); the toolkit's stubs stand in for them while building and checking.
# hadolint ignore=SC1090
RUN . "$CANN_ENV" \
 && hal=$(find -L "${ASCEND_TOOLKIT_HOME:-/usr/local/Ascend}/" -path '*stub*' -name libascend_hal.so -print -quit 2>/dev/null || true) \
 && if [ -z "$hal" ]; then echo "server-cann: no stub libascend_hal.so under ${ASCEND_TOOLKIT_HOME:-/usr/local/Ascend}: is CANN_ENV the toolkit's set_env.sh?" >&2; exit 1; fi \
 && mkdir -p /opt/arbor/build-stubs \
 && cp -L "$(dirname "$hal")"/*.so /opt/arbor/build-stubs/
# ACL graph mode (captured decode graphs, as upstream's CANN image builds for 910B) is compiled in
# for every SoC but 310P, which cannot use it; GGML_CANN_ACL_GRAPH=off turns it off at run time.
# hadolint ignore=SC1090
RUN . "$CANN_ENV" \
 && case "$SOC_TYPE" in *310[Pp]*) acl_graph=OFF ;; *) acl_graph=ON ;; esac \
 && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/opt/arbor/build-stubs" \
    TARGETARCH="$TARGETARCH" CPU_CMAKE_ARGS="$CPU_CMAKE_ARGS" PIP_INDEX_URL="$PIP_INDEX_URL" BUILD_JOBS="$BUILD_JOBS" \
    bash /opt/arbor/build-llama-cpp.sh "$LLAMA_CPP_PYTHON_SPEC" -DGGML_CANN=ON "-DSOC_TYPE=$SOC_TYPE" "-DUSE_ACL_GRAPH=$acl_graph"
# The dependencies from the hash-pinned lock (scripts/lock-dependencies.sh; DEVELOPERS.md, "Dependencies"):
# pip refuses any file whose SHA-256 the lock does not list; llama-cpp-python's own dependencies are
# there (build-llama-cpp.sh installs the bindings with --no-deps). The project goes in with --no-deps
# and the locked setuptools (--no-build-isolation).
COPY requirements/lock.txt /tmp/arbor/lock.txt
RUN pip install --no-cache-dir --index-url "$PIP_INDEX_URL" --require-hashes -r /tmp/arbor/lock.txt
# hadolint ignore=SC1090
RUN . "$CANN_ENV" && bash /opt/arbor/check-llama-cpp.sh --expect ggml-cann --stubs /opt/arbor/build-stubs
WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir --no-deps --no-build-isolation -e /app

# server: the CANN runtime libraries and operator kernels are needed at run time, so this stage
# starts from the same CANN image (no slimmer official runtime image exists); only the venv, the
# source tree and the build-time stubs (named only by the check) are added. The driver comes from
# the host (compose mounts it).
FROM ${CANN_BASE_IMAGE} AS server
ARG CANN_ENV=/usr/local/Ascend/ascend-toolkit/set_env.sh
ARG SOC_TYPE=Ascend910B3
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY docker/entrypoint.sh /usr/local/bin/arbor-entrypoint
COPY docker/check-llama-cpp.sh docker/log_writer.py /opt/arbor/
RUN chmod 0755 /usr/local/bin/arbor-entrypoint && chmod 0644 /opt/arbor/log_writer.py \
 && groupadd --system --gid 10001 arbor \
 && useradd --system --uid 10001 --gid arbor --create-home --home-dir /home/arbor --shell /sbin/nologin arbor \
 && mkdir -p /models /var/lib/arbor/cache /var/log/arbor \
 && chown arbor:arbor /var/lib/arbor/cache /var/log/arbor
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
COPY --from=build /opt/arbor/build-stubs /opt/arbor/build-stubs
# ARBOR_ENV_SCRIPT: the entrypoint sources set_env.sh, as the CANN image's own entrypoint
# (replaced here) did. CANN writes its process logs under ASCEND_PROCESS_LOG_PATH.
# ARBOR_CANN_SOC_TYPE: the SoC the backend was compiled for, whose weight types arbor-server
# checks the model against at start (server/engine/matmul_support.py).
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    ARBOR_ENV_SCRIPT=${CANN_ENV} ARBOR_CANN_SOC_TYPE=${SOC_TYPE} \
    ASCEND_PROCESS_LOG_PATH=/var/log/arbor/ascend
WORKDIR /app
# hadolint ignore=SC1090
RUN . "$CANN_ENV" && bash /opt/arbor/check-llama-cpp.sh --expect ggml-cann --stubs /opt/arbor/build-stubs server.api.app
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/arbor-entrypoint"]
CMD ["arbor-server", "--host", "0.0.0.0", "--port", "8080"]
