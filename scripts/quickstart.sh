#!/usr/bin/env bash
# The README's first command, on the embedded default (SQLite + the local backend, CPU is fine):
# set up, plan the bundled examples, start the API with its dispatcher, submit the tiny CPU demo job,
# follow it to the end and show what it measured next to what the plan predicted.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh runtime

export SHARDCTL_DATA_DIR="${SHARDCTL_DATA_DIR:-$PWD/.shardctl-demo}"
export SHARDCTL_CONFIG="$SHARDCTL_DATA_DIR/cli.json"
PORT="${SHARDCTL_PORT:-8686}"
export SHARDCTL_URL="http://127.0.0.1:$PORT"
shardctl=.venv/bin/shardctl

echo "== 1. plan the bundled examples"
"$shardctl" plan examples/*.yaml

echo "== 2. start the API with the dispatcher (data in $SHARDCTL_DATA_DIR)"
mkdir -p "$SHARDCTL_DATA_DIR"
"$shardctl" serve --port "$PORT" --with-dispatcher 2>"$SHARDCTL_DATA_DIR/serve.log" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  .venv/bin/python -c "import httpx, sys; httpx.get(sys.argv[1]).raise_for_status()" "$SHARDCTL_URL/healthz" \
    >/dev/null 2>&1 && break
  kill -0 $server 2>/dev/null || { cat "$SHARDCTL_DATA_DIR/serve.log" >&2; exit 1; }
  sleep 0.2
done
[ -s "$SHARDCTL_CONFIG" ] || "$shardctl" token create --admin >/dev/null  # an existing demo database

echo "== 3. submit the tiny CPU job to the local backend and follow it"
job=$("$shardctl" submit examples/tiny-cpu.yaml --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
"$shardctl" events "$job" --follow
"$shardctl" show "$job"
status=$("$shardctl" show "$job" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])')
[ "$status" = SUCCEEDED ]
