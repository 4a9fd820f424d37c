# The agent workbench (`arbor serve`); compose also runs the simulated incident service from it.
# No llama.cpp at all. compose.yaml builds it; by hand, from the repository root:
#   docker build -f docker/workbench.Dockerfile -t arbor-workbench:latest .

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# build: the dependencies (without llama-cpp-python) and the source tree in /opt/venv.
FROM ${PYTHON_IMAGE} AS build
ARG PIP_INDEX_URL=https://pypi.org/simple
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# The dependencies from the hash-pinned lock (scripts/lock-dependencies.sh; DEVELOPERS.md, "Dependencies"):
# pip refuses any file whose SHA-256 the lock does not list. The project goes in with --no-deps and the
# locked setuptools (--no-build-isolation), so nothing unlocked is downloaded.
COPY requirements/lock.txt /tmp/arbor/lock.txt
RUN pip install --no-cache-dir --index-url "$PIP_INDEX_URL" --require-hashes -r /tmp/arbor/lock.txt
WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir --no-deps --no-build-isolation -e /app

# workbench: `arbor serve` by default.
FROM ${PYTHON_IMAGE} AS workbench
COPY docker/entrypoint.sh /usr/local/bin/arbor-entrypoint
COPY docker/log_writer.py /opt/arbor/log_writer.py
RUN chmod 0755 /usr/local/bin/arbor-entrypoint && chmod 0644 /opt/arbor/log_writer.py \
 && groupadd --system --gid 10001 arbor \
 && useradd --system --uid 10001 --gid arbor --create-home --home-dir /home/arbor --shell /usr/sbin/nologin arbor \
 && mkdir -p /data /var/log/arbor \
 && chown arbor:arbor /data /var/log/arbor
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    ARBOR_HOST=0.0.0.0 ARBOR_PORT=8090 ARBOR_DATA_DIR=/data
WORKDIR /app
USER 10001:10001
EXPOSE 8090 8765
ENTRYPOINT ["/usr/local/bin/arbor-entrypoint"]
CMD ["arbor", "serve"]
