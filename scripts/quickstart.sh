#!/usr/bin/env bash
# The README's first command, on the embedded default (SQLite + the local backend; CPU is fine).
#
#   scripts/quickstart.sh        set up; plan the bundled examples, one line each; start the API with its
#                                dispatcher; submit the tiny CPU job and follow it to the end; show what it
#                                measured next to what the plan predicted. The server keeps running, so
#                                there is something to look at; a second run replaces it.
#   scripts/quickstart.sh stop   stop that server.
#
# SHARDCTL_DATA_DIR (default ./.shardctl-demo) holds the database, the CLI config, the server's log and
# PID; SHARDCTL_PORT (default 8686) is the API's port; SHARDCTL_DEMO_TIMEOUT (seconds, default 1200)
# bounds how long the job is followed.
set -euo pipefail
cd "$(dirname "$0")/.."

export SHARDCTL_DATA_DIR="${SHARDCTL_DATA_DIR:-$PWD/.shardctl-demo}"
export SHARDCTL_CONFIG="$SHARDCTL_DATA_DIR/cli.json"
PORT="${SHARDCTL_PORT:-8686}"
export SHARDCTL_URL="http://127.0.0.1:$PORT"
unset SHARDCTL_TOKEN  # the demo's own admin token, from its config file
PIDFILE="$SHARDCTL_DATA_DIR/server.pid"
LOG="$SHARDCTL_DATA_DIR/serve.log"
TIMEOUT="${SHARDCTL_DEMO_TIMEOUT:-1200}"
shardctl=.venv/bin/shardctl
STOP="scripts/quickstart.sh stop"
[ "$SHARDCTL_DATA_DIR" = "$PWD/.shardctl-demo" ] || STOP="SHARDCTL_DATA_DIR=$SHARDCTL_DATA_DIR $STOP"

stop_server() {  # the server an earlier run left, if it is alive and still a shardctl server
  [ -f "$PIDFILE" ] || return 1
  local pid
  pid=$(cat "$PIDFILE")
  rm -f "$PIDFILE"
  if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && ps -o args= -p "$pid" | grep -q "shardctl.* serve"; then
    kill "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid"; fi
    echo "stopped the demo server (PID $pid)"
    return 0
  fi
  return 1
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

if [ "${1:-}" = stop ]; then
  stop_server || echo "no demo server running (no live PID in $PIDFILE)"
  exit 0
elif [ $# -gt 0 ]; then
  echo "usage: scripts/quickstart.sh [stop]" >&2
  exit 1
fi

echo "== 1. set up .venv (scripts/setup.sh runtime; the first time it installs torch, which takes a while)"
bash scripts/setup.sh runtime

echo "== 2. plan the bundled examples (the whole plan of one: $shardctl plan examples/NAME.yaml)"
"$shardctl" plan --brief examples/*.yaml || [ $? -eq 2 ]  # 2: one does not fit; its line says so

echo "== 3. start the API with its dispatcher on $SHARDCTL_URL (data in $SHARDCTL_DATA_DIR)"
mkdir -p "$SHARDCTL_DATA_DIR"
stop_server || true
if port_in_use; then
  echo "port $PORT is taken by another program: stop it, or run with SHARDCTL_PORT=<free port>" >&2
  exit 1
fi
detach=()
if command -v setsid >/dev/null; then detach=(setsid); fi  # its own session: it outlives this script
nohup "${detach[@]}" "$shardctl" serve --port "$PORT" --with-dispatcher >"$LOG" 2>&1 </dev/null &
server=$!
echo "$server" >"$PIDFILE"
told=
still_running() {  # whatever happens next, say how to reach and stop the server left running
  if [ -z "$told" ] && kill -0 "$server" 2>/dev/null; then
    echo "== the demo server is still running: PID $server, log $LOG"
    echo "  stop it with:  $STOP     (or: kill \$(cat $PIDFILE))"
  fi
}
trap still_running EXIT
for _ in $(seq 1 150); do
  .venv/bin/python -c "import httpx, sys; httpx.get(sys.argv[1]).raise_for_status()" "$SHARDCTL_URL/healthz" \
    >/dev/null 2>&1 && break
  if ! kill -0 "$server" 2>/dev/null; then
    rm -f "$PIDFILE"
    echo "the server exited; its log ($LOG):" >&2
    tail -n 30 "$LOG" >&2
    exit 1
  fi
  sleep 0.2
done
[ -s "$SHARDCTL_CONFIG" ] || "$shardctl" token create --admin >/dev/null  # a database from an earlier run
echo "server PID $server, log $LOG"

echo "== 4. submit examples/tiny-cpu.yaml (a small Llama on two gloo CPU processes) and follow it"
"$shardctl" submit examples/tiny-cpu.yaml --json >"$SHARDCTL_DATA_DIR/submitted.json"
job=$(.venv/bin/python -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' \
  "$SHARDCTL_DATA_DIR/submitted.json")
echo "job $job queued"
if ! timeout "$TIMEOUT" "$shardctl" events "$job" --follow; then
  echo "(stopped following after ${TIMEOUT}s; the job goes on: $shardctl events $job --follow)"
fi
status=$("$shardctl" show "$job" --json | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["status"])')

echo "== 5. the plan's prediction next to what the job measured ($shardctl show $job --brief)"
"$shardctl" show "$job" --brief

told=1
echo "== where to look next"
echo "  the API: $SHARDCTL_URL (its OpenAPI docs: $SHARDCTL_URL/docs)"
echo "  in a shell, first point the CLI at the demo (its URL and admin token):"
echo "    export SHARDCTL_CONFIG=$SHARDCTL_CONFIG"
echo "  then:"
printf '    %-50s # %s\n' \
  "$shardctl jobs" "every job, newest first" \
  "$shardctl show $job" "the whole plan, the attempts, predicted vs measured" \
  "$shardctl events $job" "what happened, in order (--follow: live)" \
  "$shardctl submit examples/tiny-cpu.yaml" "another run"
echo "== the demo server is still running: PID $server, log $LOG"
echo "  stop it with:  $STOP     (or: kill \$(cat $PIDFILE))"
if [ "$status" != SUCCEEDED ]; then
  echo "the demo job ended $status, not SUCCEEDED: see $shardctl events $job and $LOG" >&2
  exit 1
fi
