#!/usr/bin/env bash
# Pack a CUDA build of psd for a GPU machine that has the CUDA toolkit,
# cuBLAS and cuDNN 9 but not this project's other libraries (gRPC, oneDNN,
# libyaml, libmicrohttpd...), e.g. a container image built for PyTorch:
#   scripts/gpu-bundle.sh [OUT_DIR]          (default .gpu)
# writes OUT_DIR/bundle.tar.xz holding build/bin/{psd,ps-train}, the tests
# gpu-check.sh runs (their data files come from the checkout), the bench
# programs it runs (build/bench/{bench_cuda_ops,bench_trainer,bench_group}) and every
# shared library they need except glibc, libstdc++ and the CUDA libraries.
# On the GPU machine, from the repository root:
#   tar -xJf .gpu/bundle.tar.xz -C .gpu && .gpu/use-bundle.sh
# and then `PREBUILT=1 BUILD=.gpu/build scripts/gpu-check.sh` under the
# LD_LIBRARY_PATH that use-bundle.sh prints. use-bundle.sh deletes every
# packed library that the machine already has (by soname), so the packed
# copies only fill gaps and never shadow the machine's own libraries.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.gpu}
BUILD=${BUILD:-build}
gtests="test_cuda_layers test_cuda_step test_batch_forward test_kinds test_im2col"   # what gpu-check.sh runs
gbench="bench_trainer bench_group bench_cuda_ops"   # what gpu-check.sh runs: its per-call costs and bench/batching.sh
bins="$BUILD/bin/psd $BUILD/bin/ps-train $(printf " $BUILD/tests/%s" $gtests) $(printf " $BUILD/bench/%s" $gbench)"
for b in $bins; do [ -x "$b" ] || { echo "gpu-bundle: $b missing: run make first" >&2; exit 1; }; done
"$BUILD/bin/psd" --version | grep -q "CUDA: built" || { echo "gpu-bundle: $BUILD was built without CUDA" >&2; exit 1; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build/bin" "$stage/build/tests" "$stage/build/bench" "$stage/lib"
cp $BUILD/bin/psd $BUILD/bin/ps-train "$stage/build/bin/"
for t in $gtests; do cp "$BUILD/tests/$t" "$stage/build/tests/"; done
for t in $gbench; do cp "$BUILD/bench/$t" "$stage/build/bench/"; done
# shellcheck disable=SC2086
ldd $bins | awk '$3 ~ /^\// { print $3 }' | sort -u |
  grep -v -E '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
  grep -v -E '/lib(cudart|cublas|cublasLt|cudnn[a-z_]*)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
cat >"$stage/use-bundle.sh" <<'USE'
#!/usr/bin/env bash
# Drop the packed libraries this machine already has; print the
# LD_LIBRARY_PATH that the packed binaries need (packed gaps + cuDNN/cuBLAS).
here=$(cd "$(dirname "$0")" && pwd)
for f in "$here"/lib/*.so*; do
  ldconfig -p | grep -q "^[[:space:]]*$(basename "$f") " && rm -f "$f"
done
dirs=$here/lib
for n in libcudnn.so.9 libcublas.so.13 libcudart.so.13; do
  ldconfig -p | grep -q "^[[:space:]]*$n " && continue
  [ -e "/usr/local/cuda/lib64/$n" ] && continue
  d=$(find /usr/local /opt /usr/lib -name "$n" 2>/dev/null | head -n 1)
  [ -n "$d" ] && dirs="$dirs:$(dirname "$d")"
done
echo "$dirs"
USE
chmod +x "$stage/use-bundle.sh"
mkdir -p "$OUT"
tar -cJf "$OUT/bundle.tar.xz" -C "$stage" .
echo "gpu-bundle: $OUT/bundle.tar.xz ($(du -h "$OUT/bundle.tar.xz" | cut -f1), $(ls "$stage/lib" | wc -l) libraries)"
