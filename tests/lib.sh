# tests/lib.sh - the preamble every integration script shares. Source it
# first, with the script's name:
#
#     . "$(dirname "$0")/lib.sh" it_name
#
# It sets -euo pipefail, changes to the repository root and gives:
#   BUILD            the build directory (default build)
#   tmp              a fresh directory /tmp/it_name.XXXXXX; removed at exit
#                    when the script succeeds or skips (exit 77), kept (and
#                    named) when it fails or KEEP_TMP is set
#   pids             an array: processes appended to it are killed at exit
#                    (SIGKILL; cleanup_signal=TERM sends SIGTERM and waits)
#   fail MSG...      prints "it_name: FAIL: MSG" and the last lines of every
#                    $tmp/*.log, exits 1
#   free_port        the first of 16 consecutive TCP ports (20000..32767, below
#                    Linux's ephemeral range) that nothing listens on, reserved
#                    for this script until it exits (port + 1 ... port + 15 are
#                    its too): tests running side by side never pick the same
#   listening PORT   true when something accepts on 127.0.0.1:PORT
#   wait_for SECS WHAT CMD...  runs CMD every 0.1 s until it succeeds; after
#                    SECS seconds fails with "WHAT did not happen within SECS s"
#   wait_port PORT [SECS]      wait_for a listener on 127.0.0.1:PORT (60 s)
#   on_exit          a function the script may define: called first at exit
#                    (processes it tracks its own way)
#   PY, require_py MOD...  Debian's python3; skip (exit 77) unless it imports
#                    every MOD
#   proto_stubs      ps_pb2.py and ps_pb2_grpc.py from proto/ps.proto into $tmp
#   first_psd_applied BATCH_RE BEFORE AFTER  the fault tests' count (it_faults,
#                    it_py_faults and their _sync/_ssp variants) of the batches
#                    one trainer saw applied by the psd that was killed
set -euo pipefail
lib_name=${1:-$(basename "$0" .sh)}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${BUILD:-build}
tmp=$(mktemp -d "/tmp/$lib_name.XXXXXX")
pids=()
cleanup_signal=${cleanup_signal:-KILL}
fail_tail=${fail_tail:-15}

lib_exit() {
  local rc=$?
  local p
  if declare -F on_exit >/dev/null; then on_exit || true; fi
  for p in "${pids[@]}"; do kill "-$cleanup_signal" "$p" 2>/dev/null || true; done
  [ "$cleanup_signal" = KILL ] || wait 2>/dev/null || true
  release_ports
  if { [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ]; } && [ -z "${KEEP_TMP:-}" ]; then rm -rf "$tmp"
  else echo "$lib_name: logs kept in $tmp" >&2; fi
}
trap lib_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {
  echo "$lib_name: FAIL: $*"
  local f
  for f in "$tmp"/*.log; do
    [ -f "$f" ] && { echo "--- $f"; tail -n "$fail_tail" "$f"; }
  done
  exit 1
}

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Port reservations: a symlink $PORTS_DIR/BLOCK -> the owner's pid, made
# atomically by ln -s; a block whose owner is gone (a killed test) is taken
# over. tests/export/check_resnet.py's free_port() shares the directory.
PORTS_DIR=${TMPDIR:-/tmp}/ps-test-ports
free_port() {
  local b p i owner
  mkdir -p "$PORTS_DIR"
  for _ in $(seq 200); do
    b=$(( RANDOM % 798 )); p=$(( 20000 + 16 * b ))
    if ! ln -s "$$" "$PORTS_DIR/$b" 2>/dev/null; then
      owner=$(readlink "$PORTS_DIR/$b" 2>/dev/null) || continue
      kill -0 "$owner" 2>/dev/null && continue
      rm -f "$PORTS_DIR/$b"; ln -s "$$" "$PORTS_DIR/$b" 2>/dev/null || continue
    fi
    for i in $(seq 0 15); do listening $(( p + i )) && break; done
    if listening $(( p + i )); then continue; fi  # held by something else: keep it reserved, try another
    echo "$p"; return 0
  done
  echo "$lib_name: no free port block found in $PORTS_DIR" >&2
  return 1
}
release_ports() {
  local f
  for f in "$PORTS_DIR"/*; do
    [ -L "$f" ] && [ "$(readlink "$f")" = "$$" ] && rm -f "$f"
  done
  return 0
}

wait_for() {  # SECS WHAT CMD...
  local secs=$1 what=$2
  shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$end" ] || fail "$what did not happen within $secs s"
    sleep 0.1
  done
}

wait_port() { wait_for "${2:-60}" "a listener on port $1" listening "$1"; }

PY=/usr/bin/python3
require_py() {
  local m
  for m; do
    $PY -c "import $m" 2>/dev/null || { echo "$lib_name: skipped: python3 module $m missing (scripts/install-deps.sh)"; exit 77; }
  done
}

proto_stubs() {
  $PY -m grpc_tools.protoc -Iproto --python_out="$tmp" --grpc_python_out="$tmp" proto/ps.proto ||
    fail "protoc could not compile proto/ps.proto"
}

# The batches a trainer saw applied by the psd that was killed, from its log
# cut at the kill into BEFORE and AFTER. BATCH_RE (an awk/grep ERE) matches
# its line for a batch, printed once the batch's step is acknowledged
# ("training batch N " for ps-train, "^batch N " for the Python trainer).
# Counted: those lines in BEFORE, and in AFTER up to the first retry (a
# reply the first psd sent before it died, read after SIGCONT); plus 1 when
# the batch in flight at the kill was settled as applied on the restarted
# psd ("was applied once (its Step answers OK)": answered from the
# checkpoint's records, so the first psd applied it) after that retry and
# before the batch ran again or the next batch's line.
first_psd_applied() {  # BATCH_RE BEFORE AFTER
  local re=$1 before=$2 after=$3
  echo $(( $(grep -cE -- "$re" "$before" || true) +
           $(awk -v re="$re" '/retry [0-9]* in/ { exit } $0 ~ re { n++ } END { print n + 0 }' "$after") +
           $(awk -v re="$re" 'f == 0 && /retry [0-9]* in/ { f = 1; next }
                              f == 1 && /was applied once \(its Step answers OK\)/ { s = 1 }
                              f == 1 && (/; running the batch again/ || $0 ~ re) { f = 2 }
                              END { print s + 0 }' "$after") ))
}
