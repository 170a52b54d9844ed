#!/usr/bin/env bash
# Integration: torchvision's resnet18(num_classes=10) through psd against
# PyTorch, from psd-export's model file and weights (--init-from) and from
# the module's training-mode ONNX export (model.onnx): initial values, eval
# and training forwards, every gradient of one step, the new weights and
# running statistics, and the eval export's forward
# (tests/export/check_resnet.py says what and to which tolerance).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PY=/usr/bin/python3
for m in torch torchvision grpc; do
  $PY -c "import $m" 2>/dev/null || { echo "it_resnet: skipped: python3 module $m missing (scripts/install-deps.sh)"; exit 77; }
done
tmp=$(mktemp -d /tmp/it_resnet.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
if ! timeout 900 $PY tests/export/check_resnet.py "$BUILD" "$tmp"; then
  for f in "$tmp"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 20 "$f"; }; done
  echo "FAIL: tests/export/check_resnet.py"
  exit 1
fi
echo "it_resnet: all checks passed"
