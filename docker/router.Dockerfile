# The cache-aware router in front of several arbor-servers (compose.scale.yaml): SMG, PyPI `smg`
# (the successor of SGLang's router), nothing of Arbor's. By hand, from the repository root:
#   docker build -f docker/router.Dockerfile -t arbor-router:latest .

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}
ARG PIP_INDEX_URL=https://pypi.org/simple
# smg (the `scale` extra's range of pyproject.toml) and its dependencies from the hash-pinned lock
# (scripts/lock-dependencies.sh): pip refuses any file whose SHA-256 the lock does not list.
COPY requirements/router-lock.txt /tmp/router-lock.txt
RUN pip install --no-cache-dir --index-url "$PIP_INDEX_URL" --require-hashes -r /tmp/router-lock.txt \
 && rm /tmp/router-lock.txt \
 && groupadd --system --gid 10001 arbor \
 && useradd --system --uid 10001 --gid arbor --no-create-home --shell /usr/sbin/nologin arbor
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["python", "-m", "smg.launch_router"]
