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
#    evaluates it within 3 % of the test loss psd reported.
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
port=$(free_port)
cat >"$tmp/fit.yaml" <<EOF
server: {listen: "127.0.0.1:$port", address: "127.0.0.1:$port", checkpoint_dir: $tmp/ckpt}
model: {file: $tmp/vae.yaml}
optimizer: {type: adam, lr: 0.001}
trainer: {world_size: 2, batch_size: 64, epochs: 2}
EOF
"$BUILD/bin/psd" --config "$tmp/fit.yaml" --init-from "$tmp/vae.safetensors" 2>"$tmp/psd.log" &
psd=$!
pids+=($psd)
wait_port "$port" || fail "psd did not listen"
timeout 300 "$BUILD/bin/ps-train" fit --config "$tmp/fit.yaml" --rank 1 --loss vae_bce --inputs "$DATA/train-images-idx3-ubyte" \
  --labels inputs --test-inputs "$tmp/test.npy" --max-batches 94 --seed 1 --wait-s 60 >"$tmp/fit.log" 2>&1 ||
  fail "ps-train fit --loss vae_bce"
kill -TERM $psd; wait $psd
ckpt=$(ls "$tmp"/ckpt/ckpt-*[0-9].safetensors 2>/dev/null | tail -n 1)
[ -n "$ckpt" ] || fail "psd wrote no checkpoint at SIGTERM"
timeout 300 "$PY" examples/models/vae.py --epochs 2 --max-batches 94 --batch-size 64 --test-samples 2000 --threads 2 \
  >"$tmp/torch.log" 2>&1 || fail "PyTorch's loop (examples/models/vae.py)"
"$PY" examples/models/vae.py --eval-checkpoint "$ckpt" --test-samples 2000 >"$tmp/eval.log" 2>&1 ||
  fail "psd's checkpoint into VAE with strict=True"
"$PY" - "$tmp" <<'PYEND' || fail "psd's VAE against PyTorch's (above)"
import re, sys
d = sys.argv[1]
fit, torch_, ev = (open(f"{d}/{n}.log").read() for n in ("fit", "torch", "eval"))
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
echo "it_vae: all checks passed"
