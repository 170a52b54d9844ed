#!/usr/bin/env bash
# Integration: the model-parallel language model (ps-train lm) end to end.
#  1. a fortunes corpus with a 2,000-word vocabulary (scripts/fortunes_corpus.py);
#  2. psd hosting rnn_lm (ntoken 2000, ninp = nhid = 64, 2 LSTM layers on the
#     trainers) and two trainers, 150 BPTT windows each (300 steps), one in
#     each decoder mode (--decoder fused: psd computes the loss; logits: the
#     tutorial's, logits to the trainer): the test perplexity ends 4x and
#     more below the untrained model's (measured first, with --eval-only);
#  3. a third run with --eval-only measures the final weights' test perplexity;
#     psd stops on SIGTERM and writes its checkpoint, which PyTorch's
#     RNNModel loads with load_state_dict(strict=True) and whose test
#     perplexity, computed by PyTorch alone, equals the C one (oneDNN LSTM +
#     psd's stages) to 1e-3.
# Bad corpora are refused before anything is sent.
. "$(dirname "$0")/lib.sh" it_lm
set +e
cleanup_signal=TERM

[ -f /usr/share/games/fortunes/fortunes ] || { echo "it_lm: skipped: Debian's fortunes package is not installed (scripts/install-deps.sh)"; exit 77; }
$PY -c 'import torch' 2>/dev/null || { echo "it_lm: skipped: python3-torch is not installed"; exit 77; }
$PY scripts/fortunes_corpus.py --vocab 2000 "$tmp/corpus" >"$tmp/corpus.log" || fail "corpus"

sizes=(--set model.sizes.ntoken=2000 --set model.sizes.ninp=64 --set model.sizes.nhid=64 --set model.sizes.dropout=0.2)
train_args=(--config configs/rnn_lm.yaml "${sizes[@]}" --world-size 3 --data "$tmp/corpus" --batch-size 10 --bptt 20)

# Bad corpora: a clear error naming the file, exit 1, nothing sent.
mkdir -p "$tmp/bad" && printf 'a b\n' >"$tmp/bad/train.txt" && printf 'a\n' >"$tmp/bad/valid.txt"
out=$("$BUILD/bin/ps-train" lm --config configs/rnn_lm.yaml --data "$tmp/bad" --server 127.0.0.1:1 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "bad/test.txt: cannot open" <<<"$out" || fail "missing test.txt: rc $rc: $out"
printf 'x\0y\n' >"$tmp/bad/test.txt"
out=$("$BUILD/bin/ps-train" lm --config configs/rnn_lm.yaml --data "$tmp/bad" --server 127.0.0.1:1 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "test.txt:1: NUL byte" <<<"$out" || fail "binary test.txt: rc $rc: $out"
out=$("$BUILD/bin/ps-train" lm --config configs/rnn_lm.yaml --decoder both --data "$tmp/corpus" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "decoder 'both': fused or logits" <<<"$out" || fail "bad --decoder: rc $rc: $out"
out=$("$BUILD/bin/ps-train" lm --config configs/rnn_lm.yaml --set model.sizes.ntoken=100 --data "$tmp/corpus" \
  --server 127.0.0.1:1 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "vocabulary of 2000 words does not fit the model's ntoken 100" <<<"$out" || fail "vocab > ntoken: $out"

port=$(free_port)
addr="127.0.0.1:$port"
"$BUILD/bin/psd" --config configs/rnn_lm.yaml --listen "$addr" "${sizes[@]}" --set server.checkpoint_dir="$tmp/ckpt" \
  --set server.checkpoint_every_steps=0 --set server.checkpoint_every_s=0 2>"$tmp/psd.log" &
psd=$!
pids+=($psd)
# The untrained model's test perplexity, the yardstick for "it learned" (a
# first training batch's loss depends on which trainer stepped first).
timeout 300 "$BUILD/bin/ps-train" lm "${train_args[@]}" --server "$addr" --rank 1 --eval-only >"$tmp/eval0.log" 2>&1 \
  || fail "--eval-only before training"
ppl0=$(grep 'End of training' "$tmp/eval0.log" | sed 's/.*| test ppl *\([0-9.]*\) .*/\1/')
mode=(x fused logits)  # trainer 1: psd computes the loss; trainer 2: the tutorial's logits to the trainer
for r in 1 2; do
  timeout 600 "$BUILD/bin/ps-train" lm "${train_args[@]}" --server "$addr" --rank $r --max-batches 150 \
    --decoder "${mode[$r]}" --log-every 25 >"$tmp/t$r.log" 2>&1 &
  pids+=($!)
  tp[$r]=$!
done
for r in 1 2; do wait "${tp[$r]}" || fail "trainer $r exited with $?"; done
timeout 300 "$BUILD/bin/ps-train" lm "${train_args[@]}" --server "$addr" --rank 1 --eval-only >"$tmp/eval.log" 2>&1 \
  || fail "--eval-only"
grep 'End of training' "$tmp/eval.log"
ctest=$(grep 'End of training' "$tmp/eval.log" | sed 's/.*test loss *\([0-9.]*\) .*/\1/')
cppl=$(grep 'End of training' "$tmp/eval.log" | sed 's/.*| test ppl *\([0-9.]*\) .*/\1/')
echo "test perplexity: untrained $ppl0, after 300 steps of two trainers $cppl"
awk -v a="$ppl0" -v b="$cppl" 'BEGIN { exit !(b > 0 && b < a / 4) }' || fail "test ppl did not fall 4x ($ppl0 -> $cppl)"
kill -TERM $psd
wait $psd; prc=$?
[ $prc -eq 0 ] || fail "psd exited with $prc after SIGTERM"
ckpt=$(ls "$tmp"/ckpt/ckpt-*.safetensors 2>/dev/null | grep -v optim | tail -n 1)
[ -n "$ckpt" ] || fail "no checkpoint in $tmp/ckpt"
out=$($PY tests/lm_check.py "$ckpt" "$tmp/corpus" 2 20) || fail "PyTorch: $out"
echo "$out"
tppl=$(sed 's/.*ppl \([0-9.]*\)$/\1/' <<<"$out")
awk -v a="$tppl" -v b="$cppl" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-3 * b) }' \
  || fail "PyTorch test ppl $tppl vs ps-train's $cppl"
echo "it_lm: two trainers, perplexity falls, checkpoint loads into PyTorch RNNModel (strict) with the same test loss: OK"
