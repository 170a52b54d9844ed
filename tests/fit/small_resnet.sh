#!/usr/bin/env bash
# make test-fit: the small ResNet of examples/models/small_resnet.yaml on
# Fashion-MNIST (Debian's dataset-fashion-mnist, the gzip'ed IDX files in
# /usr/share/datasets/fashion-mnist) trained through psd by two
# `ps-train fit` trainers, against PyTorch's local loop
# (examples/models/train_small_resnet.py with its twin small_resnet.py), with
# the same batch, lr schedule, momentum and 3 epochs, for each seed of
# FIT_SEEDS:
#  - psd: one psd (model.file small_resnet.yaml, model.seed S, checkpoints
#    on, server.consistency sync: each step the mean gradient of one batch
#    from each trainer), two trainers each on its half of the 60,000 images
#    for 3 epochs (so the model sees each image 3 times, as the local loop
#    does), then an eval-only `ps-train fit` on the 10,000 test images;
#  - psd stops (SIGTERM writes its checkpoint), the checkpoint loads into the
#    PyTorch twin with strict=True and its test accuracy is psd's (within
#    FIT_CKPT_TOL points: float rounding may move a borderline image);
#  - the local loop: the same batch, lr, momentum, epochs, seed, each step
#    the mean gradient of 2 batches (--accumulate 2: what sync does) - read from
#    the golden file tests/golden/fit_small_resnet.json, which
#    train_small_resnet.py --golden wrote (its "regenerate" field is the
#    command; ~3 min a seed on one core), after checking that its recipe is
#    this run's; FIT_TORCH=live runs the loop here instead (PyTorch on one
#    thread: on 2 shared cores faster than two and thread-count independent).
# The lr: 0.05 for two epochs, 0.005 for the last (ps-train fit --lr
# 0.05,0.05,0.005 through each Step's grad_scale, the loop scaling its loss
# the same way). At a constant lr the test accuracy of the last iterate
# swings by 2-3 points from seed to seed in PyTorch and psd alike (the
# BatchNorm running statistics trail the moving weights: re-estimating
# them on the same weights gains 2-3 points), which a 1-point comparison of
# two seeds cannot tell from a real gap; with the last epoch at a tenth of
# the lr the seeds agree within ~1 point.
# Why sync: under hogwild each trainer's gradient is one step stale (the
# other trainer's step lands between its Forward and its Step), which at
# this lr and momentum costs ~1.4 points after 3 epochs - in PyTorch too:
# its loop fed gradients one step stale (--stale) gives psd's hogwild accuracy
# (86.5 % against 87.9 %, the mean of seeds 1 and 2), and psd with one
# trainer matches the loop. Sync makes psd's training the loop's, so a gap
# here is a bug. FIT_CONSISTENCY=hogwild runs hogwild (expect that gap).
# Passes when the mean test accuracy over the seeds is within FIT_TOL (1)
# point of the local loop's mean. Skipped (77) while the model file or the
# data set is missing. Takes ~2-4 min on a quiet 2-core machine (psd ~1 min
# a seed; FIT_TORCH=live adds ~3 min a seed).
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
FM=${FM:-/usr/share/datasets/fashion-mnist}
SEEDS=${FIT_SEEDS:-1 2}
TOL=${FIT_TOL:-1.0}
CKPT_TOL=${FIT_CKPT_TOL:-0.1}
EPOCHS=${FIT_EPOCHS:-3}
BS=${FIT_BATCH:-64}
LR=${FIT_LR:-0.05,0.05,0.005}   # per epoch; psd's optimizer.lr is the first
LR0=${LR%%,*}
GOLDEN=${FIT_GOLDEN:-tests/golden/fit_small_resnet.json}
TORCH=${FIT_TORCH:-golden}
CONSISTENCY=${FIT_CONSISTENCY:-sync}
ACCUMULATE=$([ "$CONSISTENCY" = sync ] && echo 2 || echo 1)   # trainers per step
MOMENTUM=${FIT_MOMENTUM:-0.9}
MEAN=0.2860 STD=0.3530   # Fashion-MNIST's pixel mean and std (x / 255)
MODEL=examples/models/small_resnet.yaml
PY=/usr/bin/python3

[ -f "$MODEL" ] || { echo "test-fit: skipped: $MODEL is not there yet (model files, issue 18 parts 1-3)"; exit 77; }
[ -f "$FM/train-images-idx3-ubyte.gz" ] || { echo "test-fit: skipped: no $FM (apt install dataset-fashion-mnist)"; exit 77; }
"$PY" -c 'import torch, numpy' 2>/dev/null || { echo "test-fit: skipped: /usr/bin/python3 with torch and numpy"; exit 77; }
T_START=$(date +%s)
tmp=$(mktemp -d /tmp/test_fit.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
fail() { echo "test-fit: FAIL: $*"; for f in "$tmp"/*.log; do echo "--- $f"; tail -n 12 "$f"; done; exit 1; }
acc() { sed -n 's/.*test loss [0-9.]* accuracy \([0-9.]*\)%.*/\1/p' "$1" | tail -n 1; }
DATA=(--inputs "$FM/train-images-idx3-ubyte.gz" --labels "$FM/train-labels-idx1-ubyte.gz"
      --test-inputs "$FM/t10k-images-idx3-ubyte.gz" --test-labels "$FM/t10k-labels-idx1-ubyte.gz"
      --loss cross_entropy --input-mean "$MEAN" --input-std "$STD")

# The local loop's accuracy for seed $1: from the golden file when its
# recipe is this run's, else (FIT_TORCH=live) trained here.
torch_acc() {
  if [ "$TORCH" = live ]; then
    "$PY" examples/models/train_small_resnet.py --data "$FM" --epochs "$EPOCHS" --batch-size "$BS" --lr "$LR" \
        --momentum "$MOMENTUM" --accumulate "$ACCUMULATE" --seed "$1" --mean $MEAN --std $STD \
        >"$tmp/torch$1.log" 2>&1 || return 1
    acc "$tmp/torch$1.log"
    return
  fi
  "$PY" - "$GOLDEN" "$1" "$EPOCHS" "$BS" "$LR" "$MOMENTUM" "$MEAN" "$STD" "$ACCUMULATE" <<'PYEOF'
import json, sys
path, seed, epochs, bs, lr, mom, mean, std, accumulate = sys.argv[1:]
g = json.load(open(path))
r = g["recipe"]
want = {"epochs": int(epochs), "batch_size": int(bs), "accumulate": int(accumulate), "lr": [float(x) for x in lr.split(",")],
        "momentum": float(mom), "weight_decay": 0.0, "mean": float(mean), "std": float(std), "limit": 0}
want["stale"] = False   # a loop with stale gradients is hogwild's, not the reference
r.setdefault("stale", False)
bad = [k for k in want if r.get(k) != want[k]]
if bad or seed not in g["seeds"]:
    sys.exit("%s does not hold this run's loop (%s); regenerate it: %s, or run with FIT_TORCH=live"
             % (path, ", ".join("%s %s, not %s" % (k, r.get(k), want[k]) for k in bad) or "no seed " + seed,
                g.get("regenerate", "examples/models/train_small_resnet.py --golden")))
print(g["seeds"][seed]["accuracy"])
PYEOF
}

psd_accs=() torch_accs=()
for s in $SEEDS; do
  port=$(( 20000 + RANDOM % 20000 ))
  cat >"$tmp/fit$s.yaml" <<EOF
server:
  listen: "127.0.0.1:$port"
  address: "127.0.0.1:$port"
  consistency: $CONSISTENCY
  sync_workers: 2
  sync_reduce: mean
  checkpoint_dir: $tmp/ckpt$s
  checkpoint_every_s: 0
  checkpoint_every_steps: 0
model:
  file: $PWD/$MODEL
  seed: $s
optimizer: {type: sgd, lr: $LR0, momentum: $MOMENTUM, weight_decay: 0}
trainer: {world_size: 3, batch_size: $BS, epochs: $EPOCHS, seed: $s, log_every: 200, rpc_timeout_s: 120}
EOF
  "$BUILD/bin/psd" --check-config "$tmp/fit$s.yaml" >"$tmp/check$s.log" 2>&1 || fail "psd --check-config"
  t0=$(date +%s)
  "$BUILD/bin/psd" --config "$tmp/fit$s.yaml" 2>"$tmp/psd$s.log" &
  psd=$!; pids+=($psd)
  for r in 1 2; do
    "$BUILD/bin/ps-train" fit --config "$tmp/fit$s.yaml" --rank $r "${DATA[@]}" --lr "$LR" --no-eval --wait-s 300 >"$tmp/t$s-$r.log" 2>&1 &
    pids+=($!); tp[$r]=$!
  done
  for r in 1 2; do wait "${tp[$r]}" || fail "seed $s: trainer $r exited with $?"; done
  "$BUILD/bin/ps-train" fit --config "$tmp/fit$s.yaml" --rank 1 "${DATA[@]}" --eval-only >"$tmp/eval$s.log" 2>&1 \
    || fail "seed $s: evaluation"
  a_psd=$(acc "$tmp/eval$s.log")
  kill -TERM "$psd"; wait "$psd" || fail "seed $s: psd exited with $? after SIGTERM"
  t1=$(date +%s)
  ck=$(ls "$tmp/ckpt$s"/ckpt-*.safetensors 2>/dev/null | grep -v '\.optim\.' | sort | tail -n 1)
  [ -n "$ck" ] || fail "seed $s: psd wrote no checkpoint"
  "$PY" examples/models/train_small_resnet.py --data "$FM" --eval-checkpoint "$ck" --mean $MEAN --std $STD \
      >"$tmp/ckpt$s.log" 2>&1 || fail "seed $s: the checkpoint does not load into the twin with strict=True"
  a_ck=$(acc "$tmp/ckpt$s.log")
  a_t=$(torch_acc "$s" 2>"$tmp/torch_err$s.txt") || fail "seed $s: PyTorch's loop ($TORCH): $(tail -n 3 "$tmp/torch_err$s.txt")"
  t2=$(date +%s)
  echo "seed $s: psd + 2 trainers ($CONSISTENCY) $a_psd % ($((t1 - t0)) s), its checkpoint in PyTorch $a_ck %, PyTorch's loop $a_t % ($TORCH, $((t2 - t1)) s)"
  [ -n "$a_psd" ] && [ -n "$a_ck" ] && [ -n "$a_t" ] || fail "seed $s: an accuracy is missing"
  awk -v a="$a_psd" -v b="$a_ck" -v t="$CKPT_TOL" 'BEGIN { d = a - b; exit !(d <= t && d >= -t) }' \
    || fail "seed $s: the checkpoint evaluates to $a_ck % in PyTorch, psd says $a_psd %"
  psd_accs+=("$a_psd"); torch_accs+=("$a_t")
done
m_psd=$(printf '%s\n' "${psd_accs[@]}" | awk '{ s += $1 } END { printf "%.2f", s / NR }')
m_t=$(printf '%s\n' "${torch_accs[@]}" | awk '{ s += $1 } END { printf "%.2f", s / NR }')
echo "mean test accuracy over seeds ($SEEDS): psd $m_psd %, PyTorch $m_t % (tolerance $TOL point)"
awk -v a="$m_psd" -v b="$m_t" -v t="$TOL" 'BEGIN { d = a - b; exit !(d <= t && d >= -t) }' \
  || fail "psd's mean $m_psd % is not within $TOL point of PyTorch's $m_t %"
echo "test-fit: OK ($(( $(date +%s) - T_START )) s)"
