#!/usr/bin/env bash
# docs/layout.md matches the tree: every source file (.c .h .cu .proto
# .options) of the directories it describes file by file is listed there,
# every file it lists exists, every top-level directory is described, and
# every .c opens with a comment saying what it is for, and common/ includes
# nothing from server/ or trainer/.
. "$(dirname "$0")/lib.sh" it_layout
doc=docs/layout.md
[ -f "$doc" ] || fail "$doc is missing"

# "## dir/" starts a section; "| `a.{h,c}` |" rows name its files.
listed=$tmp/listed; : >"$listed"
dir=""
while IFS= read -r line; do
  if [[ $line =~ ^##\ ([a-z/]+)/$ ]]; then dir=${BASH_REMATCH[1]}; continue; fi
  [[ $line =~ ^##\  ]] && dir=""
  [ -n "$dir" ] || continue
  [[ $line =~ ^\|\ \`([^\`]+)\`\ \| ]] || continue
  name=${BASH_REMATCH[1]}
  if [[ $name =~ ^(.*)\.\{([a-z,]+)\}$ ]]; then
    IFS=, read -ra exts <<<"${BASH_REMATCH[2]}"
    for e in "${exts[@]}"; do echo "$dir/${BASH_REMATCH[1]}.$e" >>"$listed"; done
  else
    echo "$dir/$name" >>"$listed"
  fi
done <"$doc"
sections=$(sed -nE 's/^## ([a-z/]+)\/$/\1/p' "$doc")
[ -n "$sections" ] || fail "$doc describes no directory file by file"

bad=0
while IFS= read -r f; do
  [ -f "$f" ] || { echo "listed in $doc but not in the tree: $f"; bad=1; }
done <"$listed"
for d in $sections; do
  for f in $(find "$d" -maxdepth 1 -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.proto' -o -name '*.options' \) | sort); do
    grep -qxF "$f" "$listed" || { echo "in the tree but not in $doc: $f"; bad=1; }
  done
done
# top-level directories (not build outputs, data or caches)
for d in $(find . -mindepth 1 -maxdepth 1 -type d ! -name '.*' ! -name 'build*' ! -name data ! -name node_modules | sed 's|^\./||' | sort); do
  grep -qF "| \`$d/\` |" "$doc" || { echo "directory $d/ is not described in $doc"; bad=1; }
done
# every .c says what it is for
for f in $(find common server trainer tools tests bench -name '*.c' | sort); do
  head -n 1 "$f" | grep -q '^/\*' || { echo "$f does not open with a comment saying what it is for"; bad=1; }
done
# common/ is what both sides link: it includes no header of server/ or trainer/
side_headers=$(find server trainer -name '*.h' -printf '%f\n' | sort -u)
for f in $(find common -name '*.[ch]' -o -name '*.cu' | sort); do
  for h in $(sed -nE 's/^#include "([^"]+)".*/\1/p' "$f"); do
    ! grep -qxF "$h" <<<"$side_headers" || { echo "$f includes $h (server/ or trainer/): common/ must not"; bad=1; }
  done
done
[ $bad -eq 0 ] || fail "docs/layout.md and the tree disagree (above)"
echo "it_layout: $(wc -l <"$listed") files in $(echo $sections | wc -w) directories listed, all present, none missing: OK"
