#!/usr/bin/env bash
# Integration: `make install` puts the Python package where Debian's python3
# finds it (issue 20). Stages an install tree (make install DESTDIR=tmp,
# the default PREFIX) and checks that
#  - the package's directory, without DESTDIR, is on /usr/bin/python3's own
#    sys.path (no PYTHONPATH), so an installed psd imports as is;
#  - from that tree alone (run outside the checkout, PYTHONPATH the staged
#    directory) `import psd` finds the installed files, its generated gRPC
#    stubs and the version of the VERSION file;
#  - the installed package talks to the installed psd (started from the
#    staged bin/ with the staged configs/local.yaml): psd.connect().status()
#    returns the model psd serves.
. "$(dirname "$0")/lib.sh" it_py_install
. tests/python/lib.sh
py_require it_py_install

make --no-print-directory -s install DESTDIR="$tmp/root" BUILD="$BUILD" >"$tmp/install.log" 2>&1 || fail "make install"
init=$(cd "$tmp/root" && find . -path '*/psd/__init__.py' | head -n 1)
[ -n "$init" ] || fail "make install staged no psd/__init__.py"
dir=${init#.}; dir=${dir%/psd/__init__.py}
[ -f "$tmp/root$dir/psd/_proto/ps_pb2_grpc.py" ] || fail "no generated stubs under $dir/psd/_proto"
syspath=$(env -u PYTHONPATH $PY -c 'import sys; print("\n".join(sys.path))')
grep -qx "$dir" <<<"$syspath" || fail "$dir is not on /usr/bin/python3's sys.path: $(tr '\n' ' ' <<<"$syspath")"
echo "ok    the package goes to $dir, on /usr/bin/python3's sys.path"

port=$(free_port)
"$tmp/root/usr/local/bin/psd" --config "$tmp/root/usr/local/share/psd/configs/local.yaml" --listen "127.0.0.1:$port" \
  2>"$tmp/psd.log" &
psd=$!
pids+=("$psd")
ver=$(cat VERSION)
out=$(cd / && PYTHONPATH="$tmp/root$dir" $PY - "$tmp/root$dir" "127.0.0.1:$port" "$ver" <<'PYEOF'
import sys
import psd
import psd._proto.ps_pb2_grpc
root, addr, version = sys.argv[1:]
assert psd.__file__.startswith(root + "/psd/"), f"imported {psd.__file__}, not the installed package"
assert psd._proto.ps_pb2_grpc.__file__.startswith(root), psd._proto.ps_pb2_grpc.__file__
assert psd.__version__ == version.strip(), f"psd.__version__ {psd.__version__!r}, VERSION {version!r}"
client = psd.connect(addr, wait_s=60)
s = client.status()
assert s.get("model"), f"status without a model: {s}"
print(f"installed psd {psd.__version__} from {psd.__file__}: status model {s['model']}, version {s['model_version']}")
PYEOF
) || fail "the installed package: $out"
echo "ok    $out"
# a python3 without Debian's torch (another one first on PATH) is told what to use
msg=$(cd / && PYTHONPATH="$tmp/root$dir" $PY -c 'import sys; sys.modules["torch"] = None; import psd' 2>&1) \
  && fail "import psd without torch succeeded"
grep -q "psd needs torch (Debian's python3-torch).*run it with Debian's /usr/bin/python3" <<<"$msg" \
  || fail "import psd without torch: $msg"
echo "ok    without torch: $(tail -n 1 <<<"$msg")"
kill -TERM "$psd"; wait "$psd" || fail "the installed psd did not stop cleanly"
pids=()
echo "it_py_install: make install's Python package imports with Debian's python3 and drives the installed psd: OK"
