#!/usr/bin/env bash
# it_py_faults's restart under server.consistency=ssp (max_staleness 0),
# with two Python trainers (ranks 1, 2) and a 1 s deadline
# (trainer.rpc_timeout_s). Trainer 2 is held (SIGSTOP) 2.5 s before the
# kill, so trainer 1's Forward is held past its deadline and retried in
# place (a held Forward given up never runs) when psd is SIGKILLed; psd
# restarts from its checkpoint with the ranks' clocks afresh, so one trainer
# can end a step ahead of the other: its last Forwards are held until the
# finished rank goes idle (server.ssp_idle_s, 5 s here). Both trainers
# finish, and the restarted psd applies exactly the batches the first did
# not acknowledge (Status.contexts_applied).
TRAINERS=2 PSD_ARGS="--set server.consistency=ssp --set server.max_staleness=0 --set server.ssp_idle_s=5" \
PY_ARGS="trainer.rpc_timeout_s=1" LAG_S=2.5 \
BATCHES=${BATCHES:-80} RESTART_ONLY=1 exec bash "$(dirname "$0")/it_py_faults.sh" "$@"
