#!/usr/bin/env bash
# Integration: torchvision's resnet18(num_classes=10) and mobilenet_v2
# (ReLU6; its classifier's dropout off) through psd against
# PyTorch, from psd-export's model file and weights (--init-from) and from
# the module's training-mode ONNX export (model.onnx): initial values, eval
# and training forwards, every gradient of one step, the new weights and
# running statistics, and the eval export's forward
# (tests/export/check_resnet.py says what and to which tolerance).
. "$(dirname "$0")/lib.sh" it_resnet
require_py torch torchvision grpc
fail_tail=20
timeout 900 $PY tests/export/check_resnet.py "$BUILD" "$tmp" || fail "tests/export/check_resnet.py"
echo "it_resnet: all checks passed"
