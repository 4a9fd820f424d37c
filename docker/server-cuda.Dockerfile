# arbor-server on NVIDIA GPUs (CUDA). compose.cuda.yaml builds it; by hand, from the repository root:
#   docker build -f docker/server-cuda.Dockerfile -t arbor-server:cuda .
# Names only NVIDIA's images, so the classic builder needs nothing else (docs/deploy.md).

# The toolkit must be no newer than the host driver supports (nvidia-smi's "CUDA Version"); NVIDIA
# publishes older toolkits for older Ubuntu releases only (e.g. 12.2 on ubuntu22.04), hence both.
ARG CUDA_VERSION=12.6.3
ARG CUDA_UBUNTU=ubuntu24.04

# build: llama.cpp's libraries with GGML_CUDA on NVIDIA's devel image, the bindings, the
# dependencies and the source tree, in a virtual environment at /opt/venv.
FROM nvidia/cuda:${CUDA_VERSION}-devel-${CUDA_UBUNTU} AS build
ARG TARGETARCH
ARG PIP_INDEX_URL=https://pypi.org/simple
# The exact llama-cpp-python pin: pyproject.toml and patches/llama-cpp-python.version (kept equal by a test).
ARG LLAMA_CPP_PYTHON_SPEC="llama-cpp-python==0.3.36"
ARG CPU_CMAKE_ARGS=
# "default": real code for V100, T4, A100, RTX 30/40, L4/L40, H100/H200 (and B200, RTX 50 with
# CUDA >= 12.8), chosen from the image's CUDA_VERSION by build-llama-cpp.sh; "ggml": ggml's own list
# (mostly PTX, JIT-compiled by the driver); or e.g. "89" for a much faster build for that GPU only.
ARG CUDA_ARCHITECTURES=default
# Parallel compile jobs; empty: every core (lower it when the build runs out of memory).
ARG BUILD_JOBS=
COPY docker/install-python.sh docker/build-llama-cpp.sh docker/check-llama-cpp.sh scripts/llama-cpp-source.sh /opt/arbor/
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends build-essential cmake git \
 && rm -rf /var/lib/apt/lists/* \
 && python=$(bash /opt/arbor/install-python.sh --dev) \
 && "$python" -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY patches /opt/arbor/patches
COPY native /opt/arbor/native
# NCCL off: the runtime image has no libnccl, and one server uses one GPU.
RUN TARGETARCH="$TARGETARCH" CPU_CMAKE_ARGS="$CPU_CMAKE_ARGS" PIP_INDEX_URL="$PIP_INDEX_URL" BUILD_JOBS="$BUILD_JOBS" \
    CUDA_ARCHITECTURES="$CUDA_ARCHITECTURES" CUDA_VERSION="$CUDA_VERSION" \
    bash /opt/arbor/build-llama-cpp.sh "$LLAMA_CPP_PYTHON_SPEC" -DGGML_CUDA=ON -DGGML_CUDA_NCCL=OFF
# The dependencies from the hash-pinned lock (scripts/lock-dependencies.sh; DEVELOPERS.md, "Dependencies"):
# pip refuses any file whose SHA-256 the lock does not list; llama-cpp-python's own dependencies are
# there (build-llama-cpp.sh installs the bindings with --no-deps). The project goes in with --no-deps
# and the locked setuptools (--no-build-isolation).
COPY requirements/lock.txt /tmp/arbor/lock.txt
RUN pip install --no-cache-dir --index-url "$PIP_INDEX_URL" --require-hashes -r /tmp/arbor/lock.txt
# libcuda.so.1 comes from the host's driver at run time (NVIDIA Container Toolkit); the toolkit's
# stub stands in for it while the image is checked.
RUN mkdir -p /opt/arbor/build-stubs \
 && cp /usr/local/cuda/lib64/stubs/libcuda.so /opt/arbor/build-stubs/libcuda.so.1 \
 && bash /opt/arbor/check-llama-cpp.sh --expect ggml-cuda --stubs /opt/arbor/build-stubs
WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir --no-deps --no-build-isolation -e /app

# server: NVIDIA's runtime image (CUDA runtime + cuBLAS), the venv and the source tree, checked
# again where it will run (a cuBLAS or OpenMP library missing here fails the build, by name).
FROM nvidia/cuda:${CUDA_VERSION}-runtime-${CUDA_UBUNTU} AS server
COPY docker/entrypoint.sh /usr/local/bin/arbor-entrypoint
COPY docker/check-llama-cpp.sh docker/install-python.sh docker/log_writer.py /opt/arbor/
# The same Python as the build stage (same base, same choice). /var/cache/arbor/cuda: the driver's
# compute cache (CUDA_CACHE_PATH, a named volume in compose.cuda.yaml) for PTX it JIT-compiles.
# hadolint ignore=DL3008
RUN bash /opt/arbor/install-python.sh \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/* \
 && chmod 0755 /usr/local/bin/arbor-entrypoint && chmod 0644 /opt/arbor/log_writer.py \
 && groupadd --system --gid 10001 arbor \
 && useradd --system --uid 10001 --gid arbor --create-home --home-dir /home/arbor --shell /usr/sbin/nologin arbor \
 && mkdir -p /models /var/lib/arbor/cache /var/log/arbor /var/cache/arbor/cuda \
 && chown arbor:arbor /var/lib/arbor/cache /var/log/arbor /var/cache/arbor/cuda
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
# The stub is only ever named by check-llama-cpp.sh --stubs; it is on no library path.
COPY --from=build /opt/arbor/build-stubs /opt/arbor/build-stubs
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
WORKDIR /app
RUN bash /opt/arbor/check-llama-cpp.sh --expect ggml-cuda --stubs /opt/arbor/build-stubs server.api.app
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/arbor-entrypoint"]
CMD ["arbor-server", "--host", "0.0.0.0", "--port", "8080"]
