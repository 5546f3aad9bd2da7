#!/usr/bin/env bash
# The README's first command: set up, then plan every bundled example on the embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/shardctl plan examples/*.yaml "$@"
