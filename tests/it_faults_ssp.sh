#!/usr/bin/env bash
# it_faults's restart under server.consistency=ssp (max_staleness 0), with
# ps-train's default one call a batch and a 1 s deadline
# (trainer.rpc_timeout_s). Trainer 2 is held (SIGSTOP) 2.5 s before the
# kill, so trainer 1's Forwards are held past their deadline (settled
# NOT_FOUND: a held Forward given up never runs; run again) when psd is
# SIGKILLed; psd restarts from its checkpoint with the ranks' clocks afresh,
# so one trainer can end a step ahead of the other: its last Forwards are
# held until the finished rank goes idle (server.ssp_idle_s, 5 s here).
# Both trainers finish, and the restarted psd applies exactly the batches
# the first did not acknowledge.
PSD_ARGS="--set server.consistency=ssp --set server.max_staleness=0 --set server.ssp_idle_s=5" \
TRAINER_ARGS="--set trainer.rpc_timeout_s=1" LAG_S=2.5 \
BATCHES=${BATCHES:-40} RESTART_ONLY=1 exec bash "$(dirname "$0")/it_faults.sh" "$@"
