# tests/python/lib.sh - sourced by the Python package's tests (tests/it_py_*.sh,
# after tests/lib.sh; tests/python/run.sh) from the repository root: Debian's
# python3, the package and examples on PYTHONPATH, psd on a random loopback port.
PY=/usr/bin/python3
BUILD=${BUILD:-build}
export PYTHONPATH="$PWD/python:$PWD/examples:$PWD/tests/python${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# py_require NAME: skip (exit 77) without the modules the package needs.
py_require() {
  local m
  for m in grpc torch yaml numpy; do
    $PY -c "import $m" 2>/dev/null || { echo "$1: skipped: python3 module $m missing (scripts/install-deps.sh)"; exit 77; }
  done
  [ -f python/psd/_proto/ps_pb2_grpc.py ] || { echo "$1: python/psd/_proto is not generated: run make"; exit 1; }
}

# start_psd LOG ARGS...: psd on a random port; sets psd (pid) and addr, waits until it answers.
start_psd() {
  local log=$1; shift
  local port
  if declare -F free_port >/dev/null; then port=$(free_port); else port=$(( 20000 + RANDOM % 20000 )); fi
  addr="127.0.0.1:$port"
  "$BUILD/bin/psd" --listen "$addr" "$@" 2>>"$log" &
  psd=$!
  local i
  for i in $(seq 100); do
    "$BUILD/bin/ps-train" --server "$addr" --status --set trainer.rpc_timeout_s=5 >/dev/null 2>&1 && return 0
    kill -0 "$psd" 2>/dev/null || { echo "psd did not start:"; tail -n 20 "$log"; return 1; }
    sleep 0.1
  done
  echo "psd did not answer"; tail -n 20 "$log"; return 1
}

# accuracy LOG: the "Rank N accuracy: X%" figure of a trainer's log.
accuracy() { sed -n 's/^Rank [0-9]* accuracy: \([0-9.]*\)%.*/\1/p' "$1" | tail -n 1; }
