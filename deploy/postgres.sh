#!/usr/bin/env bash
# A local PostgreSQL for development and tests: install it (Debian) if missing, start it, and make
# the role and database `shardctl` (password `shardctl`). Prints the SQLAlchemy URL on stdout.
#   export SHARDCTL_TEST_POSTGRES_URL=$(deploy/postgres.sh)
set -euo pipefail
log() { echo "postgres.sh: $*" >&2; }
as_postgres() { runuser -u postgres -- "$@"; }

if ! command -v pg_ctlcluster >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || { log "PostgreSQL is not installed and installing it needs root"; exit 1; }
  log "installing postgresql (Debian package)"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
version=$(ls /etc/postgresql | sort -V | tail -n 1)
if ! pg_isready -h 127.0.0.1 -q; then
  log "starting cluster $version/main"
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
fi
for _ in $(seq 1 30); do pg_isready -h 127.0.0.1 -q && break; sleep 1; done
pg_isready -h 127.0.0.1 -q || { log "PostgreSQL did not come up on 127.0.0.1:5432"; exit 1; }

if ! as_postgres psql -tAc "SELECT 1 FROM pg_roles WHERE rolname = 'shardctl'" | grep -q 1; then
  as_postgres psql -q -v ON_ERROR_STOP=1 -c "CREATE ROLE shardctl LOGIN CREATEDB PASSWORD 'shardctl'"
fi
if ! as_postgres psql -tAc "SELECT 1 FROM pg_database WHERE datname = 'shardctl'" | grep -q 1; then
  as_postgres psql -q -v ON_ERROR_STOP=1 -c "CREATE DATABASE shardctl OWNER shardctl"
fi
echo "postgresql+psycopg://shardctl:shardctl@127.0.0.1:5432/shardctl"
