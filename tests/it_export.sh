#!/usr/bin/env bash
# Integration: psd-export (tools/psd-export, docs/models.md "From PyTorch").
#  - the tutorials' Net, Policy and word_language_model's RNNModel
#    (examples/models/rpc_tutorials.py), exported with the cuts their
#    shipped files document, equal configs/models/{mnist_cnn,cartpole_policy,
#    rnn_lm}.yaml node for node (names, kinds, attributes, stages), and each
#    weights file is the module's state_dict;
#  - refusals name the module or function and its source line;
#    (tests/export/check_export.py)
#  - psd takes what it wrote: --check-config with the exported mnist_cnn
#    and --init-from its weights, and rnn_lm with its weights (the
#    trainer-side LSTM's parameters included).
. "$(dirname "$0")/lib.sh" it_export

$PY tests/export/check_export.py "$tmp" || fail "tests/export/check_export.py"
for m in mnist_cnn rnn_lm; do
  printf 'model:\n  file: %s.yaml\n' "$m" >"$tmp/$m.conf.yaml"
  out=$("$BUILD/bin/psd" --check-config "$tmp/$m.conf.yaml" --init-from "$tmp/$m.safetensors" 2>&1) ||
    fail "psd refuses the export of $m: $out"
  echo "ok: psd --check-config takes the exported $m with --init-from its weights"
done
echo "it_export: all checks passed"
