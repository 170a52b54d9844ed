#!/usr/bin/env bash
# Integration: device placement at psd start-up, on any machine.
#  - psd --version says whether the CUDA backend is built in, consistently
#    with the backend list;
#  - a config placing stage fc on a CUDA device that does not exist is
#    refused before psd listens, with a message naming the stage, the
#    device and the CUDA devices found (or that CUDA is not built in);
#  - a bad device name is refused naming the stage.
. "$(dirname "$0")/lib.sh" it_placement
psd="$BUILD/bin/psd"
port=$(free_port)

ver=$("$psd" --version)
echo "$ver"
if grep -q " cuda[;)]\| cuda " <<<"$ver"; then
  grep -q "CUDA: built (runtime [0-9]*\.[0-9]*, cuDNN [0-9]*\.[0-9]*\.[0-9]*)" <<<"$ver" ||
    { echo "backend list has cuda but the version line does not say 'CUDA: built (runtime X, cuDNN Y)'"; exit 1; }
else
  grep -q "CUDA: not built" <<<"$ver" || { echo "no cuda backend but no 'CUDA: not built'"; exit 1; }
fi

expect_refused() {  # device, pattern...
  local dev=$1; shift
  set +e
  out=$(timeout 60 "$psd" --config configs/local.yaml --listen "127.0.0.1:$port" \
        --set "model.placement.fc=$dev" 2>&1)
  rc=$?
  set -e
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || { echo "psd did not refuse fc on $dev (exit $rc): $out"; exit 1; }
  for p in "$@"; do
    grep -q -- "$p" <<<"$out" || { echo "refusal of fc on $dev lacks '$p': $out"; exit 1; }
  done
  echo "refused as expected: $out"
}

expect_refused cuda:63 "model.placement.fc: cuda:63" \
  "\(CUDA devices found: [0-9]*: cuda:0 \|no CUDA devices found\|built without CUDA support\)"
expect_refused gpu:0 "model.placement.fc"
echo "it_placement: version line and placement refusals: OK"
