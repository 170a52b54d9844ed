#!/usr/bin/env bash
# it_faults's restart under server.consistency=sync (rounds of 2), with
# ps-train's default one call a batch and a 1 s deadline
# (trainer.rpc_timeout_s). Trainer 2 is held (SIGSTOP) 2.5 s before the
# kill, so trainer 1's step waits in its round past its deadline and is
# being settled ("in use") when psd is SIGKILLed; psd restarts from its
# checkpoint. Both trainers finish (the round open at the kill hangs nobody:
# its Steps settle NOT_FOUND on the restarted psd and run again into its
# rounds), and the restarted psd applies exactly the batches the first did
# not acknowledge - counted in contexts (Status.contexts_applied), a round
# being one model version. server.sync_timeout_s 5: after the restart one
# trainer may have a batch more than the other, whose last round then
# closes alone by that timeout.
PSD_ARGS="--set server.consistency=sync --set server.sync_workers=2 --set server.sync_timeout_s=5" \
TRAINER_ARGS="--set trainer.rpc_timeout_s=1" LAG_S=2.5 \
BATCHES=${BATCHES:-40} RESTART_ONLY=1 exec bash "$(dirname "$0")/it_faults.sh" "$@"
