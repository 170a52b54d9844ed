#!/usr/bin/env bash
# Integration: ps-train fit (docs/fit.md) against the real psd on loopback.
#  1. psd (mnist_cnn, fresh weights) + one `ps-train fit` on the MNIST IDX
#     files of data/mnist: 20 batches of 32, then the 2,000 test digits
#     reach >= 70 % (the untrained model: ~10 %).
#  2. The same data as .npz (uint8 images, int64 labels; numpy converts the
#     IDX files itself) and as .npy (float32 images normalised by numpy):
#     against a fresh psd of the same seed, the first batch's loss is
#     bit-identical to the IDX run's and the test accuracy within 2 points.
#  3. Refusals before any training call, naming the file: labels of another
#     count, images of another size than the model takes, a class id out of
#     range, 2^32-1 samples without values (two tiny files; refused before
#     their sample indices are allocated); psd keeps serving. Streams:
#     process substitution of a gzip'ed .npy and of .npz members, and a
#     FIFO, load whole (their sample counts named in the refusal).
#  4. A 2-server cluster (conv on ps0, fc on ps1; configs/cluster-mnist.yaml's
#     layout), two fit trainers with a held-out split, 25 batches each: both
#     report validation and test accuracy >= 55 %, both servers applied every
#     batch's Step, no partial steps.
#  5. --lr per epoch (LR,LR: each Step's grad_scale): 2 epochs of 20 batches
#     with --lr 0.03,1e-20 leave the weights as epoch 1 left them (its test
#     accuracy and the final one are the same), while --lr 0.03 (one value:
#     every epoch) moves them (they differ); --lr 0.03,0 is refused.
#  6. --one-call (a whole step in one Forward) with --loss cross_entropy,
#     against a fresh psd of the same seed: mnist_cnn ends in log_softmax,
#     so psd's cross-entropy is the NLL of run 1 - the first batch's loss
#     within 1e-5 of run 1's (same batch, same dropout masks), the test
#     accuracy within 2 points, psd's version 50 (every batch applied
#     once); with --loss nll it says it sends the three calls.
#  7. --labels inputs (an autoencoder's targets): a small convolutional
#     autoencoder (model file written here) trained with --loss mse and
#     --labels inputs, against a fresh psd of the same seed trained with the
#     targets numpy wrote ((images / 255 - mean) / std as float32 .npy, the
#     conversion of --input-scale/--input-mean/--input-std): every logged
#     training loss and the test MSE agree within 1e-4 (relative); a class
#     loss (nll) and --test-labels beside --labels inputs are refused
#     naming the flags.
. "$(dirname "$0")/lib.sh" it_fit
set +e
cleanup_signal=TERM
DATA=${DATA:-data/mnist}
MIN_ACC=${MIN_ACC:-70.0}
CLUSTER_MIN=${CLUSTER_MIN:-55.0}
[ -f "$DATA/train-images-idx3-ubyte" ] || { echo "it_fit: skipped: no MNIST in $DATA (make data)"; exit 77; }
"$PY" -c 'import numpy' 2>/dev/null || { echo "it_fit: skipped: /usr/bin/python3 with numpy is needed"; exit 77; }
base=$(free_port)

start_psd() {  # log, args...
  local log=$1; shift
  "$BUILD/bin/psd" "$@" 2>"$tmp/$log.log" &
  pids+=($!)
  psd_pid=$!
}
acc_of() { sed -n "s|^Rank [0-9]* $2 loss [0-9.]* accuracy \([0-9.]*\)%.*|\1|p" "$1" | tail -n 1; }
ge() { awk -v a="$1" -v m="$2" 'BEGIN { exit !(a != "" && a >= m) }'; }

IDX=(--inputs "$DATA/train-images-idx3-ubyte" --labels "$DATA/train-labels-idx1-ubyte"
     --test-inputs "$DATA/t10k-images-idx3-ubyte" --test-labels "$DATA/t10k-labels-idx1-ubyte")
COMMON=(--config configs/local.yaml --world-size 2 --loss nll --input-mean 0.1307 --input-std 0.3081
        --batch-size 32 --epochs 1 --max-batches 50 --log-every 10 --seed 3 --wait-s 120)

run_fit() {  # log, port, args...
  local log=$1 port=$2; shift 2
  timeout 300 "$BUILD/bin/ps-train" fit "${COMMON[@]}" --server "127.0.0.1:$port" "$@" >"$tmp/$log.log" 2>&1
}

# ---- 1. IDX ----------------------------------------------------------------
p1=$base
start_psd psd1 --config configs/local.yaml --listen "127.0.0.1:$p1"
run_fit idx "$p1" "${IDX[@]}" || fail "fit on IDX exited with $?"
kill "$psd_pid"
a_idx=$(acc_of "$tmp/idx.log" test)
echo "IDX: $(grep -m1 'training batch 0 ' "$tmp/idx.log"); test accuracy $a_idx %"
ge "$a_idx" "$MIN_ACC" || fail "IDX run: test accuracy '$a_idx' < $MIN_ACC %"
grep -q "model mnist_cnn: 2 stages in 1 hop; per sample float32 (1, 28, 28) in, (10,) out; loss nll" "$tmp/idx.log" \
  || fail "no model line"

# ---- 2. the same data as .npz and .npy --------------------------------------
"$PY" - "$DATA" "$tmp" <<'EOF' || fail "numpy conversion"
import sys, numpy as np
d, out = sys.argv[1], sys.argv[2]
def idx(name):
    raw = open("%s/%s" % (d, name), "rb").read()
    nd = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(nd)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * nd).reshape(dims)
xtr, ytr = idx("train-images-idx3-ubyte"), idx("train-labels-idx1-ubyte").astype(np.int64)
xte, yte = idx("t10k-images-idx3-ubyte"), idx("t10k-labels-idx1-ubyte").astype(np.int64)
np.savez_compressed(out + "/mnist.npz", x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
norm = lambda x: ((x.astype(np.float32) / 255 - np.float32(0.1307)) / np.float32(0.3081))[:, None]
np.save(out + "/xtr.npy", norm(xtr)); np.save(out + "/ytr.npy", ytr.astype(np.int32))
np.save(out + "/xte.npy", norm(xte)); np.save(out + "/yte.npy", yte.astype(np.uint8))
np.save(out + "/xte27.npy", xte[:, :27]); np.save(out + "/yte_bad.npy", yte + 5)
EOF
p2=$((base + 1))
start_psd psd2 --config configs/local.yaml --listen "127.0.0.1:$p2"
run_fit npz "$p2" --inputs "$tmp/mnist.npz:x_train" --labels "$tmp/mnist.npz:y_train" \
    --test-inputs "$tmp/mnist.npz:x_test" --test-labels "$tmp/mnist.npz:y_test" || fail "fit on .npz exited with $?"
kill "$psd_pid"
p3=$((base + 2))
start_psd psd3 --config configs/local.yaml --listen "127.0.0.1:$p3"
# already normalised floats: scale 1, no mean/std (the later flags override COMMON's)
run_fit npy "$p3" --inputs "$tmp/xtr.npy" --labels "$tmp/ytr.npy" --test-inputs "$tmp/xte.npy" \
    --test-labels "$tmp/yte.npy" --input-mean 0 --input-std 1 || fail "fit on .npy exited with $?"
b_idx=$(grep -m1 'training batch 0 ' "$tmp/idx.log")
for f in npz npy; do
  b=$(grep -m1 'training batch 0 ' "$tmp/$f.log")
  a=$(acc_of "$tmp/$f.log" test)
  echo "$f: $b; test accuracy $a %"
  [ "$b" = "$b_idx" ] || fail "$f: first batch '$b' differs from the IDX run's '$b_idx'"
  awk -v a="$a" -v b="$a_idx" 'BEGIN { d = a - b; exit !(a != "" && d <= 2 && d >= -2) }' \
    || fail "$f: test accuracy $a % vs the IDX run's $a_idx %"
done

# ---- 3. refusals, psd (p3) still serving -----------------------------------
expect_refusal() {  # what, needle, args...
  local what=$1 needle=$2; shift 2
  if run_fit refuse "$p3" "$@"; then fail "$what: accepted"; fi
  grep -qF -- "$needle" "$tmp/refuse.log" || fail "$what: no '$needle' in: $(tail -n 2 "$tmp/refuse.log")"
  grep -q "training batch" "$tmp/refuse.log" && fail "$what: trained before refusing"
  echo "refused ($what): $(grep -m1 'ps-train' "$tmp/refuse.log")"
}
expect_refusal "label count" "labels $DATA/t10k-labels-idx1-ubyte hold 2000" \
    --inputs "$DATA/train-images-idx3-ubyte" --labels "$DATA/t10k-labels-idx1-ubyte"
expect_refusal "image size" "inputs $tmp/xte27.npy: each sample is (27, 28), but the model's first stage 'conv' takes (1, 28, 28)" \
    --inputs "$tmp/xte27.npy" --labels "$tmp/yte.npy"
expect_refusal "class range" "labels $tmp/yte_bad.npy: sample" \
    --inputs "$tmp/xte.npy" --labels "$tmp/yte_bad.npy"
expect_refusal "loss" "--loss: unknown loss 'hinge'" "${IDX[@]}" --loss hinge
# streams read once (docs/fit.md, "Data files"): bash's process substitution
# of a gzip'ed .npy and of an .npz's members, and a FIFO with a writer, load
# whole - each then reports its 2,000 samples against the training labels (the
# pipe used to be refused as "not a data file": sniffing its format consumed
# its first bytes; a FIFO blocked the same way for a second writer)
gzip -c "$tmp/xte.npy" >"$tmp/xte.npy.gz"
expect_refusal "pipe of a gzip'ed .npy" \
    "hold 2000 samples (2000, 1, 28, 28), but labels $DATA/train-labels-idx1-ubyte hold" \
    --inputs <(cat "$tmp/xte.npy.gz") --labels "$DATA/train-labels-idx1-ubyte"
expect_refusal "pipes of .npz members" "hold 2000 samples (2000, 28, 28), but labels /dev/fd/" \
    --inputs <(cat "$tmp/mnist.npz"):x_test --labels <(cat "$tmp/mnist.npz"):y_train
mkfifo "$tmp/xte.fifo" || fail "mkfifo"
gzip -dc "$tmp/xte.npy.gz" >"$tmp/xte.fifo" &
pids+=($!)
expect_refusal "FIFO" "inputs $tmp/xte.fifo hold 2000 samples (2000, 1, 28, 28)" \
    --inputs "$tmp/xte.fifo" --labels "$DATA/train-labels-idx1-ubyte"
# two 128-byte files of 2^32-1 samples without values: refused before the
# split allocates 37 GB of sample indices (under a 4 GB address-space limit,
# so that a regression fails here instead of swapping the machine)
"$PY" -c 'import sys, numpy as np
np.save(sys.argv[1] + "/xe.npy", np.zeros((2**32 - 1, 0), np.uint8))
np.save(sys.argv[1] + "/ye.npy", np.zeros((2**32 - 1, 0), np.int64))' "$tmp" || fail "numpy: empty samples"
vlimit=4000000   # an ASan build (make asan) reserves terabytes of shadow address space: no limit there
case "$(ldd "$BUILD/bin/ps-train" 2>/dev/null)" in *libasan*) vlimit=unlimited ;; esac   # (not grep -q: pipefail + SIGPIPE)
(ulimit -v "$vlimit"
 expect_refusal "empty samples" "inputs $tmp/xe.npy: each of the 4294967295 samples is (0,), no values" \
     --inputs "$tmp/xe.npy" --labels "$tmp/ye.npy") || exit 1
"$BUILD/bin/ps-train" status --server "127.0.0.1:$p3" >"$tmp/status.log" 2>&1 || fail "psd stopped serving"
kill "$psd_pid"

# ---- 4. two servers, two trainers --------------------------------------------
c0=$((base + 3)) c1=$((base + 4))
cat >"$tmp/cluster.yaml" <<EOF
cluster: {name: it-fit}
servers:
  ps0: {address: "127.0.0.1:$c0"}
  ps1: {address: "127.0.0.1:$c1"}
model:
  name: mnist_cnn
  seed: 1
  placement: {conv: ps0/cpu, fc: ps1}
optimizer: {type: sgd, lr: 0.03}
trainer: {world_size: 3, batch_size: 32, epochs: 1, rpc_timeout_s: 60}
EOF
start_psd c0 --config "$tmp/cluster.yaml" --name ps0
start_psd c1 --config "$tmp/cluster.yaml" --name ps1
for r in 1 2; do
  timeout 300 "$BUILD/bin/ps-train" fit --config "$tmp/cluster.yaml" --rank $r "${IDX[@]}" --loss nll \
      --input-mean 0.1307 --input-std 0.3081 --val-fraction 0.05 --max-batches 25 --log-every 5 --wait-s 120 \
      >"$tmp/cl$r.log" 2>&1 &
  pids+=($!); tp[$r]=$!
done
for r in 1 2; do wait "${tp[$r]}" || fail "cluster trainer $r exited with $?"; done
batches=0
for r in 1 2; do
  grep -q "model mnist_cnn: 2 stages in 2 hops" "$tmp/cl$r.log" || fail "trainer $r: not 2 hops"
  v=$(acc_of "$tmp/cl$r.log" "epoch 1/1 validation")
  a=$(acc_of "$tmp/cl$r.log" test)
  echo "cluster trainer $r: validation $v %, test $a %"
  # each evaluates when it ends, the other may still be training: the bar is lower than one trainer's
  ge "$v" "$CLUSTER_MIN" && ge "$a" "$CLUSTER_MIN" || fail "trainer $r: accuracy $v / $a % < $CLUSTER_MIN %"
  grep -q "partial steps (applied" "$tmp/cl$r.log" && fail "trainer $r reports partial steps"
  n=$(sed -n 's/.*: \([0-9]*\) samples in .*/\1/p' "$tmp/cl$r.log")
  batches=$(( batches + (n + 31) / 32 ))
done
status=$("$BUILD/bin/ps-train" status --config "$tmp/cluster.yaml" 2>&1) || fail "ps-train status: $status"
for s in ps0 ps1; do
  v=$(grep " $s " <<<"$status" | sed -n 's/.* version \([0-9]*\),.*/\1/p')
  [ "$v" = "$batches" ] || fail "$s applied ${v:-?} steps, the trainers ran $batches batches"
  grep " $s " <<<"$status" | grep -q "partial steps 0 applied here, 0 lost here" || fail "$s: partial steps counted"
done

# ---- 5. --lr per epoch --------------------------------------------------------
p5=$((base + 5))
start_psd psd5 --config configs/local.yaml --listen "127.0.0.1:$p5"
run_fit lr_sched "$p5" "${IDX[@]}" --epochs 2 --max-batches 20 --lr 0.03,1e-20 || fail "fit --lr 0.03,1e-20 exited with $?"
kill "$psd_pid"
start_psd psd6 --config configs/local.yaml --listen "127.0.0.1:$((p5 + 1))"
run_fit lr_const "$((p5 + 1))" "${IDX[@]}" --epochs 2 --max-batches 20 --lr 0.03 || fail "fit --lr 0.03 exited with $?"
e1=$(acc_of "$tmp/lr_sched.log" "epoch 1/2 test") e2=$(acc_of "$tmp/lr_sched.log" test)
k1=$(acc_of "$tmp/lr_const.log" "epoch 1/2 test") k2=$(acc_of "$tmp/lr_const.log" test)
echo "--lr 0.03,1e-20: test accuracy $e1 % after epoch 1, $e2 % after epoch 2; --lr 0.03: $k1 %, $k2 %"
[ -n "$e1" ] && [ "$e1" = "$e2" ] || fail "--lr 0.03,1e-20: epoch 2 moved the weights ($e1 % -> $e2 %)"
[ -n "$k1" ] && [ -n "$k2" ] && [ "$k1" != "$k2" ] || fail "--lr 0.03: epoch 2 did not move the weights ($k1 % -> $k2 %)"
out=$("$BUILD/bin/ps-train" fit "${COMMON[@]}" --server "127.0.0.1:$((p5 + 1))" "${IDX[@]}" --lr 0.03,0 2>&1) \
  && fail "--lr 0.03,0 was accepted"
grep -q -- "--lr 0.03,0: every value must be > 0" <<<"$out" || fail "--lr 0.03,0: no clear refusal: $out"
kill "$psd_pid"

# ---- 6. --one-call -------------------------------------------------------------
p7=$((base + 7))
start_psd psd7 --config configs/local.yaml --listen "127.0.0.1:$p7"
run_fit one "$p7" "${IDX[@]}" --one-call --loss cross_entropy || fail "fit --one-call exited with $?"
a_one=$(acc_of "$tmp/one.log" test)
l_idx=$(sed -n 's/.*training batch 0 loss \([0-9.]*\).*/\1/p' "$tmp/idx.log" | head -n 1)
l_one=$(sed -n 's/.*training batch 0 loss \([0-9.]*\).*/\1/p' "$tmp/one.log" | head -n 1)
v_one=$("$BUILD/bin/ps-train" --server "127.0.0.1:$p7" --status 2>/dev/null | sed -n 's/^model_version: //p')
echo "--one-call: first batch loss $l_one (three calls: $l_idx), test accuracy $a_one % (three calls: $a_idx %), psd version $v_one"
awk -v a="$l_one" -v b="$l_idx" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= 1e-5 * b) }' \
  || fail "--one-call: first batch loss '$l_one' is not the three calls' '$l_idx'"
awk -v a="$a_one" -v b="$a_idx" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 2) }' \
  || fail "--one-call: test accuracy '$a_one' % is more than 2 points from the three calls' '$a_idx' %"
[ "$v_one" = 50 ] || fail "--one-call: psd's model version '$v_one' after 50 batches"
grep -q "one-call" "$tmp/one.log" && fail "--one-call with cross_entropy: it said it would not apply"
out=$("$BUILD/bin/ps-train" fit "${COMMON[@]}" --server "127.0.0.1:$p7" "${IDX[@]}" --max-batches 2 --no-eval \
  --one-call 2>&1) || fail "fit --one-call --loss nll exited with $?"
grep -q -- "--one-call needs --loss cross_entropy" <<<"$out" || fail "--one-call with nll: no note: $out"
# --no-eval evaluates nothing but still reports each epoch's training loss
grep -Eq "epoch 1/[0-9]+: training loss [0-9.]+ \(mean of 2 batches\)" <<<"$out" || fail "--no-eval: no training loss line: $out"
grep -Eq "(test|validation) loss" <<<"$out" && fail "--no-eval evaluated: $out"
kill "$psd_pid"

# ---- 7. --labels inputs -----------------------------------------------------------
cat >"$tmp/ae.yaml" <<'EOF'
name: tiny_ae
about: a convolutional autoencoder of 1x28x28 images (it_fit)
max_batch: 512
stages:
  - name: ae
    input: {shape: [1, 28, 28], dtype: float32}
    nodes:
      - {name: enc, kind: Conv2d, out_channels: 4, kernel_size: 3, stride: 2, padding: 1}
      - {name: act, kind: ReLU}
      - {name: dec, kind: ConvTranspose2d, out_channels: 1, kernel_size: 3, stride: 2, padding: 1, output_padding: 1}
EOF
sed -e "s|^  name: mnist_cnn.*|  file: $tmp/ae.yaml|" -e '/^  placement:/,/^    fc: cpu/d' configs/local.yaml >"$tmp/ae_local.yaml"
# the targets numpy converted: section 2's xtr.npy / xte.npy, (images / 255 - 0.1307) / 0.3081 as float32
AE=(--config "$tmp/ae_local.yaml" --loss mse --inputs "$DATA/train-images-idx3-ubyte"
    --test-inputs "$DATA/t10k-images-idx3-ubyte")
p8=$((base + 8))
start_psd psd8 --config "$tmp/ae_local.yaml" --listen "127.0.0.1:$p8"
run_fit ae_in "$p8" "${AE[@]}" --labels inputs || fail "fit --labels inputs exited with $?"
kill "$psd_pid"
start_psd psd9 --config "$tmp/ae_local.yaml" --listen "127.0.0.1:$((p8 + 1))"
run_fit ae_npy "$((p8 + 1))" "${AE[@]}" --labels "$tmp/xtr.npy" --test-labels "$tmp/xte.npy" \
  || fail "fit with numpy's targets exited with $?"
losses() { sed -n 's/.*training batch [0-9]* loss \([0-9.]*\).*/\1/p' "$1"; sed -n 's/^Rank [0-9]* test loss \([0-9.]*\).*/\1/p' "$1"; }
li=$(losses "$tmp/ae_in.log" | tr '\n' ' ') ln=$(losses "$tmp/ae_npy.log" | tr '\n' ' ')
echo "--labels inputs: losses $li; numpy's targets: $ln"
[ "$(wc -w <<<"$li")" -ge 6 ] || fail "--labels inputs: too few losses logged: '$li'"
awk -v a="$li" -v b="$ln" 'BEGIN { n = split(a, x, " "); if (n != split(b, y, " ")) exit 1
  for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < 0) d = -d; if (d > 1e-4 * y[i] + 1e-6) exit 1 } }' \
  || fail "--labels inputs: losses '$li' differ from numpy's targets' '$ln'"
first=$(losses "$tmp/ae_in.log" | head -n 1) final=$(losses "$tmp/ae_in.log" | tail -n 1)
awk -v a="$final" -v b="$first" 'BEGIN { exit !(a < 0.8 * b) }' || fail "--labels inputs: test MSE $final vs first batch $first"
p3=$((p8 + 1))
expect_refusal "--labels inputs with nll" "--labels inputs makes the inputs the targets, which needs a loss of dense targets" \
    "${AE[@]}" --labels inputs --loss nll
expect_refusal "--labels inputs with --test-labels" "leave out --test-labels $tmp/xte.npy" \
    "${AE[@]}" --labels inputs --test-labels "$tmp/xte.npy"
kill "$psd_pid"

echo "it_fit: IDX, .npz and .npy agree, refusals name the file, 2-server cluster trains, --lr per epoch, --one-call, --labels inputs: OK"
