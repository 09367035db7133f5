#!/usr/bin/env bash
# Starts a private PostgreSQL server for the shared Responses store tests and prints its URL
# (postgres://tokenmill@127.0.0.1:PORT/postgres). Idempotent: a server already running on that
# data directory is reused. PostgreSQL comes from Debian's `postgresql` package (installed
# with apt-get when missing; needs root for that). The cluster lives in a git-ignored cache,
# listens on 127.0.0.1 only, trusts local connections, and is never the system's own cluster.
#
# Usage: scripts/start-postgres.sh          # prints the URL
#        scripts/start-postgres.sh stop
# Env:   TOKENMILL_PG_DIR   data directory (default: <repo>/.cache/postgres)
#        TOKENMILL_PG_PORT  port (default: 54329)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data_dir="${TOKENMILL_PG_DIR:-$repo_root/.cache/postgres}"
port="${TOKENMILL_PG_PORT:-54329}"
log() { echo "start-postgres: $*" >&2; }

bin_dir() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }

if [ -z "$(bin_dir)" ]; then
  log "installing PostgreSQL from apt"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends postgresql >&2
fi
bin="$(bin_dir)"
[ -x "$bin/initdb" ] || { log "no initdb under /usr/lib/postgresql"; exit 1; }

# PostgreSQL refuses to run as root: run it as the package's `postgres` user then.
as_owner() {
  if [ "$(id -u)" = 0 ]; then
    su postgres -s /bin/sh -c "$(printf '%q ' "$@")"
  else
    "$@"
  fi
}

if [ "${1:-}" = stop ]; then
  as_owner "$bin/pg_ctl" -D "$data_dir" -m fast stop >&2 || true
  exit 0
fi

mkdir -p "$data_dir"
if [ "$(id -u)" = 0 ]; then
  chown postgres "$data_dir"
  # The postgres user must be able to reach the data directory through its parents.
  dir="$data_dir"
  while [ "$dir" != / ]; do dir="$(dirname "$dir")"; chmod o+x "$dir" 2>/dev/null || true; done
fi
if [ ! -f "$data_dir/PG_VERSION" ]; then
  as_owner "$bin/initdb" -D "$data_dir" -U tokenmill -A trust --no-sync >&2
fi
if ! as_owner "$bin/pg_ctl" -D "$data_dir" status >/dev/null 2>&1; then
  as_owner "$bin/pg_ctl" -D "$data_dir" -w -l "$data_dir/server.log" \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $data_dir -c fsync=off" start >&2
fi
echo "postgres://tokenmill@127.0.0.1:$port/postgres"
