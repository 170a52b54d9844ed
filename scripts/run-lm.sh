#!/usr/bin/env bash
# The language model on one machine (`make run-lm`): psd hosting rnn_lm
# (configs/rnn_lm.yaml) on loopback, two ps-train lm trainers (ranks 1, 2,
# each on its half of train.txt) for EPOCHS epochs, then one --eval-only
# pass over the final weights: validation and test perplexity beside the
# unigram model's on the same test tokens. psd stops cleanly at the end.
#   CONFIG=configs/rnn_lm.yaml EPOCHS=1 TRAINERS=2 DATA=data/fortunes scripts/run-lm.sh [extra ps-train flags]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
CONFIG=${CONFIG:-configs/rnn_lm.yaml}
TRAINERS=${TRAINERS:-2}
EPOCHS=${EPOCHS:-1}
DATA=${DATA:-data/fortunes}
logdir=$(mktemp -d /tmp/psd-lm.XXXXXX)

. scripts/local-cluster.sh
psd_start "$CONFIG"
status=0
workers_run "$TRAINERS" trainer "$BUILD/bin/ps-train" lm --config "$CONFIG" --data "$DATA" --epochs "$EPOCHS" "$@" ||
  status=1

echo
echo "== the final weights (ps-train lm --eval-only: validation and test perplexity)"
: >"$logdir/eval.log"
"$BUILD/bin/ps-train" lm --config "$CONFIG" --rank 1 --world-size $((TRAINERS + 1)) --data "$DATA" --eval-only "$@" \
  >>"$logdir/eval.log" 2> >(tee -a "$logdir/eval.log" | grep --line-buffered "progress" >&2) || status=1
grep -h "^| end of epoch\|^| End of training" "$logdir/eval.log" || tail -n 5 "$logdir/eval.log"
ratio=$(sed -n 's/.*| ratio \([0-9.]*\) .*/\1/p' "$logdir/eval.log")
if [ -n "$ratio" ]; then
  if awk -v r="$ratio" 'BEGIN { exit !(r <= 0.7) }'; then
    echo "test perplexity is $ratio x the unigram model's (target <= 0.7): met"
  else
    echo "test perplexity is $ratio x the unigram model's (target <= 0.7): NOT met"
  fi
fi

psd_status=0
psd_stop || psd_status=$?
tail -n 2 "$logdir/psd.log"
if [ "$psd_status" -ne 0 ]; then echo "psd exited with status $psd_status"; status=1; fi
echo "logs in $logdir"
exit $status
