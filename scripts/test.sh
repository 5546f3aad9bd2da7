#!/usr/bin/env bash
# The README's second command: set up with the dev tools, start the components the tests use, then
# lint, type-check and run every test. Under CI=true a component that cannot start is an error;
# elsewhere its tests skip and say why.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,runtime

component() {  # component NAME VAR SCRIPT: export VAR from SCRIPT's stdout
  local name=$1 var=$2 script=$3 value
  if [ -n "${!var:-}" ]; then return 0; fi
  if value=$(bash "$script"); then
    export "$var=$value"
    echo "== $name: $value"
  elif [ -n "${CI:-}" ]; then
    echo "== $name could not start and CI needs it" >&2
    exit 1
  else
    echo "== $name unavailable: its tests will skip" >&2
  fi
}
component PostgreSQL SHARDCTL_TEST_POSTGRES_URL deploy/postgres.sh
component Slurm SHARDCTL_TEST_SLURM deploy/slurm.sh

echo "== ruff"
.venv/bin/ruff check .
echo "== mypy"
.venv/bin/mypy
echo "== import contracts (pyproject.toml [tool.importlinter])"
.venv/bin/lint-imports --no-cache
echo "== pytest"
if [ "$#" -eq 0 ] && [ -n "${SHARDCTL_TEST_SLURM:-}" ]; then
  # The Slurm tests spend most of their time waiting on the cluster (scheduling, KillWait, requeues):
  # they run beside the rest, in a session of their own, and their report follows the main one.
  # The rest runs on SHARDCTL_TEST_WORKERS pytest-xdist workers (default 2, each with its own
  # PostgreSQL database; 1: one plain session).
  workers=() n_workers=${SHARDCTL_TEST_WORKERS:-2}
  if [ "$n_workers" -gt 1 ]; then workers=(-n "$n_workers" --dist worksteal); fi
  slurm_log=$(mktemp)
  .venv/bin/pytest tests/slurm -p no:cacheprovider >"$slurm_log" 2>&1 &
  slurm_pid=$!
  main_rc=0
  .venv/bin/pytest --ignore=tests/slurm "${workers[@]}" || main_rc=$?
  slurm_rc=0
  wait "$slurm_pid" || slurm_rc=$?
  echo "== pytest tests/slurm (ran beside the rest)"
  cat "$slurm_log"
  rm -f "$slurm_log"
  echo "== pytest: rest rc=$main_rc, tests/slurm rc=$slurm_rc"
  [ "$main_rc" -eq 0 ] && [ "$slurm_rc" -eq 0 ]
  exit
fi
exec .venv/bin/pytest "$@"
