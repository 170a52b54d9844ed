#!/usr/bin/env bash
# Integration: model files through psd itself.
#  - psd --check-config with model.file (relative to the config file's
#    directory) prints the stage table of a residual CNN (shapes, parameters,
#    placement) and passes;
#  - model-file errors stop --check-config with exit 2 as
#    "psd: CONFIG: model.file: FILE:LINE: ...", psd start-up and ps-train
#    printing them alike: a cycle
#    (naming its nodes), an unknown kind, an Add of two shapes, a stage cut
#    with two live tensors (naming them), a model.arch with no file (listing
#    the shipped ones);
#  - --init-from a state_dict whose running_mean has another shape is
#    refused naming the model file's line of the node;
#  - psd serves the model and ListParameters lists the BatchNorm buffers
#    after the parameters (generic_client.py's listing).
. "$(dirname "$0")/lib.sh" it_models
mkdir -p "$tmp/cfg/models"

cat >"$tmp/cfg/models/res.yaml" <<'EOF'
name: res
about: a residual block
stages:
  - name: body
    input: {shape: [1, 8, 8], dtype: float32}
    nodes:
      - {name: stem, kind: Conv2d, out_channels: 8, kernel_size: 3, padding: 1, bias: false}
      - {name: bn, kind: BatchNorm2d}
      - {name: relu, kind: ReLU}
      - {name: layer1.0.conv1, kind: Conv2d, out_channels: 8, kernel_size: 3, padding: 1}
      - {name: layer1.0.add, kind: Add, inputs: [layer1.0.conv1, relu]}
      - {name: pool, kind: AdaptiveAvgPool2d, output_size: 1}
      - {name: flat, kind: Flatten}
  - name: head
    nodes:
      - {name: fc, kind: Linear, out_features: 3}
EOF
cat >"$tmp/cfg/psd.yaml" <<'EOF'
model:
  file: models/res.yaml
  placement:
    head: cpu
EOF
printf 'model:\n  seed: 2\n' >"$tmp/cfg/plain.yaml"
out=$("$BUILD/bin/psd" --check-config "$tmp/cfg/psd.yaml" 2>&1) || fail "valid model refused: $out"
<<<"$out" grep -q "model res (.*res.yaml): a residual block" || fail "no stage table: $out"
<<<"$out" grep -Eq "^  body +\(1, 8, 8\) f32 +\(8\) f32 +672 " || fail "body row: $out"
<<<"$out" grep -Eq "^  head +\(8\) f32 +\(3\) f32 +27 " || fail "head row: $out"
echo "ok: --check-config prints the stage table of a model file (model.file relative to the config)"

refused() {  # what needle yaml-lines
  local what=$1 needle=$2
  printf '%s\n' "$3" >"$tmp/bad.yaml"
  if "$BUILD/bin/psd" --check-config "$tmp/cfg/plain.yaml" --set model.file="$tmp/bad.yaml" >"$tmp/out" 2>&1; then
    cat "$tmp/out"; fail "--check-config passed $what"
  fi
  grep -q -- "$needle" "$tmp/out" || { cat "$tmp/out"; fail "$what: expected '$needle'"; }
  # one form for every model-file error: the config, the key, then file:line
  grep -q -- "^psd: $tmp/cfg/plain.yaml: model.file: $tmp/bad.yaml:[0-9]*: " "$tmp/out" ||
    { cat "$tmp/out"; fail "$what: not 'psd: CONFIG: model.file: FILE:LINE: ...'"; }
  echo "ok: refuses $what: $(grep -o -- "bad.yaml:[0-9]*.\{0,100\}" "$tmp/out" | head -n 1)"
}
HEAD='name: bad
stages:
  - name: s
    input: {shape: [4]}
    nodes:'
refused "a cycle" "bad.yaml:7: stage 's': node 'b' is on a cycle (b <- c <- b)" "$HEAD
      - {name: a, kind: ReLU}
      - {name: b, kind: Add, inputs: [a, c]}
      - {name: c, kind: ReLU, input: b}"
refused "an unknown kind" "bad.yaml:6: node 'a': unknown kind 'Conv3d'" "$HEAD
      - {name: a, kind: Conv3d}"
refused "an Add of two shapes" "bad.yaml:7: node 'b' (Add)" "$HEAD
      - {name: a, kind: Linear, out_features: 3}
      - {name: b, kind: Add, inputs: [a, input]}"
refused "two tensors across a cut" "live across the cut s|t: b (the output of stage 's'), a" "$HEAD
      - {name: a, kind: ReLU}
      - {name: b, kind: Tanh}
  - name: t
    nodes:
      - {name: c, kind: Add, inputs: [input, a]}"
refused "a dtype mismatch" "bad.yaml:6: node 'a' (Linear): .*int64; it takes .* float32" "${HEAD/\{shape: \[4\]\}/\{shape: [4], dtype: int64\}}
      - {name: a, kind: Linear, out_features: 3}"
# psd start-up and ps-train print a model-file error as --check-config does
"$BUILD/bin/psd" --check-config "$tmp/cfg/plain.yaml" --set model.file="$tmp/bad.yaml" 2>"$tmp/check.err" && fail "dtype"
! "$BUILD/bin/psd" --config "$tmp/cfg/plain.yaml" --set model.file="$tmp/bad.yaml" --listen "127.0.0.1:$(free_port)" \
  2>"$tmp/start.err" || fail "psd started with a bad model file"
cmp "$tmp/check.err" "$tmp/start.err" || fail "psd start-up: $(cat "$tmp/start.err") != $(cat "$tmp/check.err")"
printf '%s\n' "$HEAD
      - {name: a, kind: Conv3d}" >"$tmp/bad.yaml"
"$BUILD/bin/psd" --check-config "$tmp/cfg/plain.yaml" --set model.file="$tmp/bad.yaml" 2>"$tmp/check.err" && fail "Conv3d"
! timeout 60 "$BUILD/bin/ps-train" --config "$tmp/cfg/plain.yaml" --set model.file="$tmp/bad.yaml" --max-batches 1 \
  2>"$tmp/train.err" >/dev/null || fail "ps-train took a bad model file"
[ "$(sed 's/^psd: //' "$tmp/check.err")" = "$(sed 's/^ps-train: //' "$tmp/train.err")" ] ||
  fail "ps-train: $(cat "$tmp/train.err") != psd: $(cat "$tmp/check.err")"
# ps-train status with a cluster config reads the model file for the placement too
printf 'servers:\n  ps0: {address: "127.0.0.1:1"}\nmodel:\n  placement:\n    s: ps0\n' >"$tmp/cfg/cl.yaml"
"$BUILD/bin/psd" --check-config "$tmp/cfg/cl.yaml" --set model.file="$tmp/bad.yaml" 2>"$tmp/check.err" && fail "Conv3d"
! "$BUILD/bin/ps-train" status --config "$tmp/cfg/cl.yaml" --set model.file="$tmp/bad.yaml" 2>"$tmp/st.err" >/dev/null ||
  fail "ps-train status took a bad model file"
[ "$(sed 's/^psd: //' "$tmp/check.err")" = "$(sed 's/^ps-train status: //' "$tmp/st.err")" ] ||
  fail "ps-train status: $(cat "$tmp/st.err") != psd: $(cat "$tmp/check.err")"
echo "ok: psd start-up, ps-train and ps-train status print model-file errors as --check-config does"
if "$BUILD/bin/psd" --check-config "$tmp/cfg/plain.yaml" --set model.arch=nope >"$tmp/out" 2>&1; then
  fail "model.arch nope passed"
fi
grep -q "no model 'nope'" "$tmp/out" && grep -q "mnist_cnn" "$tmp/out" || { cat "$tmp/out"; fail "model.arch nope"; }
grep -q "^psd: $tmp/cfg/plain.yaml: model.arch: " "$tmp/out" || { cat "$tmp/out"; fail "model.arch nope: prefix"; }
echo "ok: refuses model.arch with no file, listing the shipped models"

# --init-from: a running_mean of another shape names the node's line
$PY - "$tmp/init.safetensors" <<'PYEOF'
import sys, torch, torch.nn as nn
sys.path.insert(0, "scripts")
from gen_golden import write_safetensors
sd = {"stem.weight": torch.zeros(8, 1, 3, 3), "bn.weight": torch.ones(8), "bn.bias": torch.zeros(8),
      "bn.running_mean": torch.zeros(9), "bn.running_var": torch.ones(8),
      "bn.num_batches_tracked": torch.tensor(0, dtype=torch.int64),
      "layer1.0.conv1.weight": torch.zeros(8, 8, 3, 3), "layer1.0.conv1.bias": torch.zeros(8),
      "fc.weight": torch.zeros(3, 8), "fc.bias": torch.zeros(3)}
write_safetensors(sys.argv[1], sd, {"format": "pt"})
PYEOF
if "$BUILD/bin/psd" --check-config "$tmp/cfg/psd.yaml" --init-from "$tmp/init.safetensors" >"$tmp/out" 2>&1; then
  fail "--init-from with a mis-shaped buffer passed"
fi
grep -q "bn.running_mean.*psd.yaml: model.file: .*res.yaml:8: node 'bn'" "$tmp/out" ||
  { cat "$tmp/out"; fail "--init-from message"; }
echo "ok: --init-from refuses a mis-shaped buffer: $(grep -o "tensor 'bn.running_mean'.*" "$tmp/out")"

# psd serves it; ListParameters lists the buffers after the parameters
port=$(free_port)
"$BUILD/bin/psd" --config "$tmp/cfg/psd.yaml" --listen "127.0.0.1:$port" 2>"$tmp/psd.log" &
pids+=($!)
wait_port "$port" 30
proto_stubs
PYTHONPATH="$tmp" $PY - "127.0.0.1:$port" <<'PYEOF' || { cat "$tmp/psd.log"; fail "ListParameters"; }
import sys
import grpc
import ps_pb2, ps_pb2_grpc
stub = ps_pb2_grpc.ParameterServerStub(grpc.insecure_channel(sys.argv[1]))
ps = stub.ListParameters(ps_pb2.ListParametersRequest(), timeout=30).parameters
names = [(p.name, p.buffer, p.dtype, list(p.shape)) for p in ps]
want = [("stem.weight", False), ("bn.weight", False), ("bn.bias", False), ("layer1.0.conv1.weight", False),
        ("layer1.0.conv1.bias", False), ("fc.weight", False), ("fc.bias", False), ("bn.running_mean", True),
        ("bn.running_var", True), ("bn.num_batches_tracked", True)]
assert [(n, b) for n, b, _, _ in names] == want, names
assert names[-1][2] == ps_pb2.INT64 and names[-1][3] == [], names[-1]
got = {t.name: t for t in stub.GetParameters(ps_pb2.GetParametersRequest(), timeout=30).parameters}
assert list(got["bn.num_batches_tracked"].shape) == [] and got["bn.num_batches_tracked"].dtype == ps_pb2.INT64
print("ok: ListParameters lists 7 parameters then the buffers %s; GetParameters returns them"
      % [n for n, b, _, _ in names if b])
PYEOF
kill -TERM "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true; pids=()
echo "it_models: model files: stage table, file:line refusals, --init-from, buffers listed: OK"
