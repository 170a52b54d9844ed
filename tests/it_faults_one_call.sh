#!/usr/bin/env bash
# it_faults with one call a batch (ps-train --one-call: a Forward with the
# batch's class ids and step=true): psd SIGKILLed and restarted from its
# checkpoint mid-training; the one-call units whose replies were lost settle
# by Step (applied once, or run again when psd never had them), and every
# batch is applied exactly once on the psd that acknowledged it.
TRAINER_ARGS=--one-call exec bash "$(dirname "$0")/it_faults.sh" "$@"
