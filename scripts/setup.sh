#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv and install shardctl into it.
#   scripts/setup.sh            # the control plane: API, planner, CLI
#   scripts/setup.sh dev        # plus test and lint tools
#   scripts/setup.sh dev,runtime  # plus torch 2.13.0 for the in-job runtime
# Works on a fresh Debian machine that has only python3: it installs python3-venv if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
PY="${PYTHON:-python3}"

if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "shardctl needs Python >= 3.11 (found: $("$PY" --version 2>&1))" >&2
  exit 1
fi
if ! "$PY" -m venv --help >/dev/null 2>&1 || ! "$PY" -c 'import ensurepip' >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "installing python3-venv (Debian ships venv separately)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  else
    echo "python3 -m venv is unavailable: install python3-venv" >&2
    exit 1
  fi
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
if [[ ",$extras," == *",runtime,"* ]]; then
  # torch first and pinned, so nothing that depends on it pulls another (multi-GB) build.
  "${pip[@]}" "torch==2.13.0"
fi
spec="."
[ -n "$extras" ] && spec=".[$extras]"
"${pip[@]}" -e "$spec"
if [[ ",$extras," == *",dev,"* ]] && [ ! -x /usr/bin/chromium ]; then
  # tests/ui drive Debian's Chromium with Playwright (its own browser download is never used).
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "installing chromium (the dashboard's browser tests, tests/ui)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "note: /usr/bin/chromium is missing: tests/ui skip (fail under CI=true); apt-get install chromium" >&2
  fi
fi
