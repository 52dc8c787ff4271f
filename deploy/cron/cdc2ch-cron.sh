#!/usr/bin/env bash
# Run `cdc2ch run --once ARGS...` from cron, never two at a time (see crontab.example).
#
# Environment:
#   CDC2CH_ENV_FILE   optional KEY=value file loaded first (secrets: CDC2CH_CLICKHOUSE_PASSWORD...)
#   CDC2CH_BIN        the cdc2ch executable (default: cdc2ch on PATH)
#   CDC2CH_LOCK_FILE  the lock (default: ${XDG_RUNTIME_DIR:-/tmp}/cdc2ch-cron.lock); give each
#                     config its own when several crontab lines run different configs
#
# Exit status: cdc2ch's own (0 all pipelines caught up, 1 a pipeline failed, 2 bad config, 75 a
# pipeline is run by another process), or 75 as well when the previous run of this script still
# holds the lock: the run is skipped with one line on stderr, and nothing else is started.
# cron mails whatever a job prints, so crontab.example appends all output to a log file instead.
set -euo pipefail

BUSY_EXIT=75 # EX_TEMPFAIL, as cdc2ch uses when another process runs a pipeline

if [[ -n "${CDC2CH_ENV_FILE:-}" ]]; then
    if [[ ! -r "$CDC2CH_ENV_FILE" ]]; then
        echo "$(date -u +%FT%TZ) cdc2ch-cron: cannot read CDC2CH_ENV_FILE=$CDC2CH_ENV_FILE" >&2
        exit 2
    fi
    set -a # export everything the file sets
    # shellcheck disable=SC1090
    . "$CDC2CH_ENV_FILE"
    set +a
fi

bin="${CDC2CH_BIN:-cdc2ch}"
lock="${CDC2CH_LOCK_FILE:-${XDG_RUNTIME_DIR:-/tmp}/cdc2ch-cron.lock}"

# The lock lives on fd 9, which cdc2ch (and its JVM) inherit through exec: it is held until they
# have all exited, and released by the kernel however they end.
exec 9>>"$lock"
if ! flock --nonblock 9; then
    echo "$(date -u +%FT%TZ) cdc2ch-cron: skipped, the previous run still holds $lock" >&2
    exit "$BUSY_EXIT"
fi

exec "$bin" run --once "$@"
