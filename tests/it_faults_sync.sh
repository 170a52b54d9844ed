#!/usr/bin/env bash
# it_faults's restart under server.consistency=sync (rounds of 2), with
# ps-train's default one call a batch and a 1 s deadline
# (trainer.rpc_timeout_s): psd SIGKILLed mid-training, maybe with a round
# open, and restarted from its checkpoint. Both trainers finish (a round
# open at the kill hangs nobody: its Steps settle NOT_FOUND on the restarted
# psd and run again into its rounds), and the restarted psd applies exactly
# the batches the first did not acknowledge - counted in contexts
# (Status.contexts_applied), a round being one model version.
PSD_ARGS="--set server.consistency=sync --set server.sync_workers=2 --set server.sync_timeout_s=5" \
TRAINER_ARGS="--set trainer.rpc_timeout_s=1" LAG_S=2.5 \
BATCHES=${BATCHES:-40} RESTART_ONLY=1 exec bash "$(dirname "$0")/it_faults.sh" "$@"
