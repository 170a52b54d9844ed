#!/usr/bin/env bash
# Integration: PyTorch's examples/vae model (examples/models/vae.py, the
# class verbatim: torch.randn_like's reparameterisation, a (recon, mu,
# logvar) tuple returned) through psd-export and `ps-train fit --loss
# vae_bce --labels inputs` on MNIST, against PyTorch's own loop with the
# same batch (64), Adam (lr 1e-3), 2 epochs of 94 batches and the same
# 2,000 test digits:
#  - psd-export joins the tuple (784 + 20 + 20 = 824 values per sample) and
#    maps randn_like to a RandnLike node;
#  - each epoch's training loss and the final test loss within 5 % of
#    PyTorch's (the noise and the shuffles differ; an untrained VAE's loss
#    is ~544 per sample, both fall below 200);
#  - psd's checkpoint loads into the module with strict=True and PyTorch
#    evaluates it within 3 % of the test loss psd reported;
#  - the same for the module's torch.onnx.export (RandomNormalLike as
#    RandnLike, the three graph outputs joined), after check_vae_onnx.py's
#    checks of the import (mu, logvar equal PyTorch's; the noise drawn).
. "$(dirname "$0")/lib.sh" it_vae
set +e
cleanup_signal=TERM
DATA=${DATA:-data/mnist}
[ -f "$DATA/train-images-idx3-ubyte" ] || { echo "it_vae: skipped: no MNIST in $DATA (make data)"; exit 77; }
require_py torch
tools/psd-export examples/models/vae.py:VAE --input-shape 1,28,28 -o "$tmp/vae.yaml" >"$tmp/export.log" 2>&1 ||
  fail "psd-export of examples/models/vae.py:VAE"
grep -q "784 + 20 + 20 = 824 values per sample" "$tmp/export.log" || fail "psd-export did not join (recon, mu, logvar)"
grep -q "kind: RandnLike" "$tmp/vae.yaml" || fail "no RandnLike node for torch.randn_like"
"$PY" -c "
import numpy as np, sys
raw = open('$DATA/t10k-images-idx3-ubyte', 'rb').read()
np.save('$tmp/test.npy', np.frombuffer(raw, np.uint8, offset=16).reshape(-1, 1, 28, 28)[:2000])" ||
  fail "writing the test digits"
# fit_run NAME MODEL-LINE [psd args...]: psd serving the model, ps-train fit --loss vae_bce as PyTorch's loop
# trains, psd's checkpoint at SIGTERM named in $tmp/NAME.ckpt
fit_run() {
  local name=$1 model=$2 port
  shift 2
  port=$(free_port)
  cat >"$tmp/$name.yaml" <<EOF
server: {listen: "127.0.0.1:$port", address: "127.0.0.1:$port", checkpoint_dir: $tmp/ckpt-$name}
model: {$model}
optimizer: {type: adam, lr: 0.001}
trainer: {world_size: 2, batch_size: 64, epochs: 2}
EOF
  "$BUILD/bin/psd" --config "$tmp/$name.yaml" "$@" 2>"$tmp/psd-$name.log" &
  local psd=$!
  pids+=($psd)
  wait_port "$port" || fail "psd ($name) did not listen"
  timeout 300 "$BUILD/bin/ps-train" fit --config "$tmp/$name.yaml" --rank 1 --loss vae_bce \
    --inputs "$DATA/train-images-idx3-ubyte" --labels inputs --test-inputs "$tmp/test.npy" --max-batches 94 --seed 1 \
    --wait-s 60 >"$tmp/fit-$name.log" 2>&1 || fail "ps-train fit --loss vae_bce ($name)"
  kill -TERM $psd; wait $psd
  ls "$tmp/ckpt-$name"/ckpt-*[0-9].safetensors 2>/dev/null | tail -n 1 >"$tmp/$name.ckpt"
  [ -s "$tmp/$name.ckpt" ] || fail "psd ($name) wrote no checkpoint at SIGTERM"
}
fit_run export "file: $tmp/vae.yaml" --init-from "$tmp/vae.safetensors"
# the same module through torch.onnx.export: RandomNormalLike and three graph outputs (check_vae_onnx.py)
"$PY" tests/export/check_vae_onnx.py "$BUILD" "$tmp" >"$tmp/onnx.log" 2>&1 || { cat "$tmp/onnx.log"; fail "check_vae_onnx.py"; }
grep "^ok: " "$tmp/onnx.log"
fit_run onnx "onnx: $tmp/vae.onnx"
timeout 300 "$PY" examples/models/vae.py --epochs 2 --max-batches 94 --batch-size 64 --test-samples 2000 --threads 2 \
  >"$tmp/torch.log" 2>&1 || fail "PyTorch's loop (examples/models/vae.py)"
for name in export onnx; do
  "$PY" examples/models/vae.py --eval-checkpoint "$(cat "$tmp/$name.ckpt")" --test-samples 2000 >"$tmp/eval-$name.log" 2>&1 ||
    fail "psd's checkpoint ($name) into VAE with strict=True"
  "$PY" - "$tmp" "$name" <<'PYEND' || fail "psd's VAE ($name) against PyTorch's (above)"
import re, sys
d, name = sys.argv[1], sys.argv[2]
fit, torch_, ev = (open(f"{d}/{n}.log").read() for n in ("fit-" + name, "torch", "eval-" + name))
print(f"{name}:")
psd_train = [float(v) for v in re.findall(r"epoch \d/2: training loss ([0-9.]+)", fit)]
psd_test = float(re.findall(r"Rank 1 test loss ([0-9.]+) \(2000 samples\)", fit)[-1])
pt = re.findall(r"train loss ([0-9.]+) test loss ([0-9.]+)", torch_)
pt_train, pt_test = [float(a) for a, _ in pt], float(pt[-1][1])
ck = float(re.search(r"strict=True: test loss ([0-9.]+)", ev).group(1))
ok = True
def check(cond, what):
    global ok
    print(("ok: " if cond else "FAIL: ") + what)
    ok &= bool(cond)
check(len(psd_train) == 2 and len(pt_train) == 2, f"two epochs each (psd {psd_train}, PyTorch {pt_train})")
for e, (a, b) in enumerate(zip(psd_train, pt_train)):
    check(abs(a - b) <= 0.05 * b, f"epoch {e + 1} training loss per sample: psd {a:.2f}, PyTorch {b:.2f} (within 5 %)")
check(abs(psd_test - pt_test) <= 0.05 * pt_test and psd_test < 200 and pt_test < 200,
      f"test loss on 2,000 digits: psd {psd_test:.2f}, PyTorch {pt_test:.2f} (within 5 %, both below 200; untrained ~544)")
check(abs(ck - psd_test) <= 0.03 * psd_test,
      f"psd's checkpoint in the module (strict=True) evaluates to {ck:.2f}, psd said {psd_test:.2f} (within 3 %)")
sys.exit(0 if ok else 1)
PYEND
done
echo "it_vae: all checks passed"
