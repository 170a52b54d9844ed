#!/usr/bin/env bash
# Integration: `make install` ships the model files and the installed psd
# finds them by name (model.arch) away from the checkout:
#  - make install DESTDIR=TMP PREFIX=/usr/local puts configs/models/*.yaml,
#    byte for byte, under TMP/usr/local/share/psd/models;
#  - the installed psd, run from a directory with no configs/models and
#    with PSD_MODEL_PATH unset, resolves each shipped model.arch to the
#    installed file (the path --check-config prints) and its stage table
#    equals the one of the built psd in the checkout;
#  - a model.arch that is not shipped is refused, listing the installed ones.
. "$(dirname "$0")/lib.sh" it_install
unset PSD_MODEL_PATH

make -s --no-print-directory install BUILD="$BUILD" DESTDIR="$tmp/root" PREFIX=/usr/local >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "make install"; }
models=$tmp/root/usr/local/share/psd/models
n=0
for f in configs/models/*.yaml; do
  cmp -s "$f" "$models/$(basename "$f")" || fail "$f is not installed as $models/$(basename "$f")"
  n=$((n + 1))
done
[ "$n" -ge 3 ] || fail "only $n shipped model files"
echo "ok: make install put the $n shipped model files under \$(PREFIX)/share/psd/models"

repo=$PWD
mkdir -p "$tmp/elsewhere"
for f in configs/models/*.yaml; do
  arch=$(basename "$f" .yaml)
  printf 'model:\n  arch: %s\n' "$arch" >"$tmp/elsewhere/$arch.yaml"
  (cd "$tmp/elsewhere" && "$tmp/root/usr/local/bin/psd" --check-config "$arch.yaml") >"$tmp/inst.out" 2>&1 ||
    { cat "$tmp/inst.out"; fail "installed psd refused model.arch $arch"; }
  grep -q "^model $arch ($models/$arch.yaml)" "$tmp/inst.out" ||
    { cat "$tmp/inst.out"; fail "installed psd did not read $models/$arch.yaml"; }
  (cd "$tmp/elsewhere" && "$repo/$BUILD/bin/psd" --check-config "$arch.yaml") >"$tmp/built.out" 2>&1 ||
    { cat "$tmp/built.out"; fail "built psd refused model.arch $arch"; }
  diff <(sed 1d "$tmp/inst.out") <(sed 1d "$tmp/built.out") >/dev/null ||
    { diff <(sed 1d "$tmp/inst.out") <(sed 1d "$tmp/built.out") || true; fail "$arch: the stage tables differ"; }
done
echo "ok: the installed psd resolves each shipped model.arch to its installed file, away from the checkout"

printf 'model:\n  arch: nope\n' >"$tmp/elsewhere/nope.yaml"
if (cd "$tmp/elsewhere" && "$tmp/root/usr/local/bin/psd" --check-config nope.yaml) >"$tmp/out" 2>&1; then
  fail "model.arch nope passed"
fi
grep -q "no model 'nope'" "$tmp/out" && grep -q "mnist_cnn" "$tmp/out" || { cat "$tmp/out"; fail "model.arch nope"; }
echo "ok: an unknown model.arch is refused, listing the installed models"
echo "it_install: make install ships the model files and psd finds them: OK"
