#!/usr/bin/env bash
# it_faults with the three calls a batch (ps-train --split-calls: Forward,
# Backward, Step). it_faults itself runs ps-train's default, one call a
# batch (a Forward with the batch's class ids and step=true). psd SIGKILLed
# and restarted from its checkpoint mid-training; units whose replies were
# lost settle by Step, and every batch is applied exactly once on the psd
# that acknowledged it.
TRAINER_ARGS=--split-calls exec bash "$(dirname "$0")/it_faults.sh" "$@"
