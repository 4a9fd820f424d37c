#!/bin/bash
# Entrypoint of every Arbor image (installed as /usr/local/bin/arbor-entrypoint):
# - sources ARBOR_ENV_SCRIPT when set (CANN's set_env.sh, as the CANN image's own entrypoint did);
# - copies the service's output into ARBOR_LOG_FILE (on the logs volume, so logs outlive the
#   container) while keeping it on stdout for `docker compose logs`: log_writer.py (installed as
#   /opt/arbor/log_writer.py) rotates the file by size (ARBOR_LOG_MAX_MB, ARBOR_LOG_BACKUPS);
#   without a python3 or that file, plain `tee -a` (not rotated, with a warning);
# - execs the command, so that it receives the stop signal itself and its exit status is the
#   container's (the log writer exits when the command's output closes).
if [ -n "${ARBOR_ENV_SCRIPT:-}" ]; then
  # shellcheck disable=SC1090  # the script is chosen at run time
  . "$ARBOR_ENV_SCRIPT" || { echo "arbor-entrypoint: cannot load $ARBOR_ENV_SCRIPT" >&2; exit 1; }
fi
if [ -n "${ARBOR_LOG_FILE:-}" ] && mkdir -p "$(dirname "$ARBOR_LOG_FILE")"; then
  # Beside this script in a checkout (docker/), else where the images install it.
  writer="$(dirname "$0")/log_writer.py"
  [ -f "$writer" ] || writer=/opt/arbor/log_writer.py
  if [ -f "$writer" ] && command -v python3 >/dev/null; then
    # -I: CANN's set_env.sh puts its own directories on PYTHONPATH; the writer needs only the stdlib.
    exec > >(exec python3 -I "$writer" "$ARBOR_LOG_FILE") 2>&1
  else
    echo "arbor-entrypoint: no python3 or $writer: $ARBOR_LOG_FILE is appended to without rotation" >&2
    exec > >(tee -a "$ARBOR_LOG_FILE") 2>&1
  fi
fi
exec "$@"
