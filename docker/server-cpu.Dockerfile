# arbor-server on CPUs (x86-64 without AMX, or ARM64). compose.yaml builds it; by hand, from the
# repository root:  docker build -f docker/server-cpu.Dockerfile -t arbor-server:cpu .
#
# One Dockerfile per backend, each naming only its own base images, and classic Dockerfile syntax
# only (no heredocs, COPY --chmod or RUN --mount): Docker's classic builder, which older Docker
# packages and docker-compose 1.x use, builds every stage of a file, so a file must never need
# another backend's base image (docs/deploy.md, "Why one Dockerfile per backend").
# No model weights and no secrets go into the image; the GGUF file is mounted at /models.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# build: llama.cpp's libraries (CPU flags chosen by architecture, never AMX or -march=native),
# the bindings, the dependencies and the source tree, in a virtual environment at /opt/venv.
FROM ${PYTHON_IMAGE} AS build
ARG TARGETARCH
ARG PIP_INDEX_URL=https://pypi.org/simple
# The exact llama-cpp-python pin: pyproject.toml and patches/llama-cpp-python.version (kept equal by a test).
ARG LLAMA_CPP_PYTHON_SPEC="llama-cpp-python==0.3.36"
# Empty: docker/build-llama-cpp.sh chooses the CPU flags for the architecture.
ARG CPU_CMAKE_ARGS=
# Parallel compile jobs; empty: every core (lower it when the build runs out of memory).
ARG BUILD_JOBS=
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake git \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY docker/build-llama-cpp.sh docker/check-llama-cpp.sh scripts/llama-cpp-source.sh /opt/arbor/
COPY patches /opt/arbor/patches
COPY native /opt/arbor/native
RUN TARGETARCH="$TARGETARCH" CPU_CMAKE_ARGS="$CPU_CMAKE_ARGS" PIP_INDEX_URL="$PIP_INDEX_URL" BUILD_JOBS="$BUILD_JOBS" \
    bash /opt/arbor/build-llama-cpp.sh "$LLAMA_CPP_PYTHON_SPEC"
# The dependencies from the hash-pinned lock (scripts/lock-dependencies.sh; DEVELOPERS.md, "Dependencies"):
# pip refuses any file whose SHA-256 the lock does not list; llama-cpp-python's own dependencies are
# there (build-llama-cpp.sh installs the bindings with --no-deps). The project goes in with --no-deps
# and the locked setuptools (--no-build-isolation).
COPY requirements/lock.txt /tmp/arbor/lock.txt
RUN pip install --no-cache-dir --index-url "$PIP_INDEX_URL" --require-hashes -r /tmp/arbor/lock.txt \
 && bash /opt/arbor/check-llama-cpp.sh --expect ggml-cpu
WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir --no-deps --no-build-isolation -e /app

# server: slim runtime with the venv and the source tree, checked again where it will run.
FROM ${PYTHON_IMAGE} AS server
COPY docker/entrypoint.sh /usr/local/bin/arbor-entrypoint
COPY docker/check-llama-cpp.sh docker/log_writer.py /opt/arbor/
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/* \
 && chmod 0755 /usr/local/bin/arbor-entrypoint && chmod 0644 /opt/arbor/log_writer.py \
 && groupadd --system --gid 10001 arbor \
 && useradd --system --uid 10001 --gid arbor --create-home --home-dir /home/arbor --shell /usr/sbin/nologin arbor \
 && mkdir -p /models /var/lib/arbor/cache /var/log/arbor \
 && chown arbor:arbor /var/lib/arbor/cache /var/log/arbor
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /app
RUN bash /opt/arbor/check-llama-cpp.sh --expect ggml-cpu server.api.app
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/arbor-entrypoint"]
CMD ["arbor-server", "--host", "0.0.0.0", "--port", "8080"]
