#!/bin/bash
# Entrypoint of every Arbor image (installed as /usr/local/bin/arbor-entrypoint):
# - sources ARBOR_ENV_SCRIPT when set (CANN's set_env.sh, as the CANN image's own entrypoint did);
# - copies the service's output into ARBOR_LOG_FILE (on the logs volume, so logs outlive the
#   container) while keeping it on stdout for `docker compose logs`;
# - execs the command, so that it receives the stop signal itself.
if [ -n "${ARBOR_ENV_SCRIPT:-}" ]; then
  # shellcheck disable=SC1090  # the script is chosen at run time
  . "$ARBOR_ENV_SCRIPT" || { echo "arbor-entrypoint: cannot load $ARBOR_ENV_SCRIPT" >&2; exit 1; }
fi
if [ -n "${ARBOR_LOG_FILE:-}" ] && mkdir -p "$(dirname "$ARBOR_LOG_FILE")"; then
  exec > >(tee -a "$ARBOR_LOG_FILE") 2>&1
fi
exec "$@"
