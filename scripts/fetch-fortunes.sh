#!/usr/bin/env bash
# fetch-fortunes.sh DIR - put a word-level language-modelling corpus built
# from Debian's fortune cookies into DIR (train.txt, valid.txt, test.txt in
# Penn Treebank form; scripts/fortunes_corpus.py says how).
#
# Idempotent: does nothing when DIR already holds the three files. Installs
# the `fortunes` package (apt-get, root or sudo) when its text files are
# missing.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
DIR=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SRC=/usr/share/games/fortunes
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

if [ -s "$DIR/train.txt" ] && [ -s "$DIR/valid.txt" ] && [ -s "$DIR/test.txt" ]; then
  exit 0
fi
if [ ! -f "$SRC/fortunes" ]; then
  echo "fetch-fortunes: installing Debian's fortunes package"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "fetch-fortunes: need root to install the fortunes package" >&2; exit 1; }
    SUDO=sudo
  fi
  $SUDO apt-get install -y --no-install-recommends fortunes >/dev/null || {
    $SUDO apt-get update >/dev/null && $SUDO apt-get install -y --no-install-recommends fortunes >/dev/null; }
fi
"$PY" "$ROOT/scripts/fortunes_corpus.py" --src "$SRC" "$DIR"
