#!/usr/bin/env bash
# Integration: the documentation stays true.
#  - Every ```sh block of README.md and docs/*.md is run (from the repository
#    root, build/bin on PATH, each in a fresh `bash -euo pipefail` in its own
#    process group, killed with whatever it left running when it ends, at most
#    DOCS_BLOCK_S seconds) and must succeed - or the line before it says
#    `<!-- not run: REASON -->` with a reason.
#    A plain ``` block right after a block that runs is the output it
#    prints: each of its lines but blank and `...` ones must be printed, in
#    that order (`/home/me/psd` stands for the checkout).
#  - Every ```python block parses (they need a psd, data or a model of the
#    reader's, so they are not run).
#  - Every docs/*.md page is linked from README.md, and every relative link
#    of README.md and docs/*.md points at a file that exists (pages other
#    branches bring are listed in PENDING until they land).
# Prints one line per block; fails on the first broken rule it finds in each
# file and on any block that fails.
. "$(dirname "$0")/lib.sh" it_docs
set +e  # a failing block is counted (below), not the end of the run
DOCS_BLOCK_S=${DOCS_BLOCK_S:-120}
# Pages README.md links that other work in flight writes; remove a name once its page is here.
PENDING=""
[ -x "$BUILD/bin/psd" ] || { echo "FAIL: $BUILD/bin/psd not built"; exit 1; }

$PY - "$tmp" "$PENDING" README.md docs/*.md <<'PYEOF' || exit 1
import os, re, sys
tmp, pending, files = sys.argv[1], set(sys.argv[2].split()), sys.argv[3:]
bad = 0
def fail(msg):
    global bad
    print("FAIL  " + msg)
    bad += 1
n = 0
runs = open(os.path.join(tmp, "blocks.txt"), "w")
for f in files:
    lines = open(f, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip().startswith("<!-- not run"):
            m = re.match(r"\s*<!-- not run: (.*\S)\s*-->\s*$", line)
            if not m or len(m.group(1)) < 8:
                fail(f"{f}:{i+1}: a not-run marker needs a reason: <!-- not run: REASON -->")
            if i + 1 >= len(lines) or lines[i + 1].strip() != "```sh":
                fail(f"{f}:{i+1}: a not-run marker must stand on the line right before a ```sh block")
        if line.strip().startswith("```") and line.strip() != "```":
            lang = line.strip()[3:].strip()
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            if j == len(lines):
                fail(f"{f}:{i+1}: unterminated ``` block")
                break
            if lang == "python":   # shown, not run (it needs a psd and data): it must at least parse
                try:
                    compile("\n".join(lines[i + 1:j]) + "\n", f"{f}:{i+1}", "exec")
                except SyntaxError as e:
                    fail(f"{f}:{i+1}: the ```python block does not parse: {e}")
            if lang in ("sh", "bash", "shell", "console"):
                if lang != "sh":
                    fail(f"{f}:{i+1}: shell blocks are ```sh (got ```{lang})")
                prev = lines[i - 1].strip() if i else ""
                if not prev.startswith("<!-- not run"):
                    n += 1
                    path = os.path.join(tmp, f"block{n:03d}.sh")
                    with open(path, "w") as b:
                        b.write("\n".join(lines[i + 1:j]) + "\n")
                    runs.write(f"{path}\t{f}:{i+1}\n")
                    # a plain ``` block right after it is the output it prints
                    k = j + 1
                    while k < len(lines) and not lines[k].strip():
                        k += 1
                    if k < len(lines) and lines[k].strip() == "```":
                        e = k + 1
                        while e < len(lines) and lines[e].strip() != "```":
                            e += 1
                        with open(path + ".expect", "w") as x:
                            x.write("\n".join(lines[k + 1:e]) + "\n")
            i = j + 1
            continue
        i += 1
    # links: [text](target) outside code
    text = "\n".join(lines)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    for m in re.finditer(r"\]\(([^)\s]+)\)", text):
        t = m.group(1)
        if re.match(r"[a-z]+:", t) or t.startswith("#"):
            continue
        target = os.path.normpath(os.path.join(os.path.dirname(f), t.split("#")[0]))
        if not os.path.exists(target):
            if target in pending:
                print(f"note  {f}: link to {target}: not here yet (pending; tests/it_docs.sh PENDING)")
            else:
                fail(f"{f}: link to {t}: {target} does not exist")
readme = open("README.md", encoding="utf-8").read()
for f in files:
    if f.startswith("docs/") and f"]({f})" not in readme and f"]({f}#" not in readme:
        fail(f"{f} is not linked from README.md")
for p in sorted(pending):
    if os.path.exists(p):
        print(f"note  {p} exists now: remove it from PENDING in tests/it_docs.sh")
lines_readme = readme.count("\n")
if lines_readme > 250:
    fail(f"README.md has {lines_readme} lines (a front page: at most 250)")
print(f"{n} blocks to run; README.md {lines_readme} lines")
sys.exit(1 if bad else 0)
PYEOF

export PATH="$PWD/$BUILD/bin:$PATH"
failed=0 ran=0
while IFS=$'\t' read -r block where; do
  t0=$(date +%s)
  setsid timeout -k 5 "$DOCS_BLOCK_S" bash -euo pipefail "$block" >"$block.out" 2>&1 &
  pid=$!
  wait "$pid"; rc=$?
  kill -9 -- "-$pid" 2>/dev/null || true   # whatever the block left running
  ran=$((ran + 1))
  if [ $rc -eq 0 ] && [ -f "$block.expect" ] && ! $PY - "$block.expect" "$block.out" "$PWD" >"$block.diff" <<'PYEOF'
import sys
want = [l.rstrip().replace("/home/me/psd", sys.argv[3]) for l in open(sys.argv[1]).read().split("\n")]
got = [l.rstrip() for l in open(sys.argv[2], errors="replace").read().split("\n")]
i = 0
for w in want:
    if not w or w == "...":
        continue
    while i < len(got) and got[i] != w:
        i += 1
    if i == len(got):
        print(f"the output block's line is not printed (in this order): {w!r}")
        sys.exit(1)
    i += 1
PYEOF
  then
    rc=1; cat "$block.diff" >>"$block.out"
  fi
  if [ $rc -eq 0 ]; then
    echo "ok    $where ($(( $(date +%s) - t0 ))s)"
  else
    failed=$((failed + 1))
    echo "FAIL  $where (exit $rc):"; sed 's/^/      | /' "$block"; echo "      output:"; tail -n 20 "$block.out" | sed 's/^/      > /'
  fi
done <"$tmp/blocks.txt"
[ $failed -eq 0 ] || { echo "it_docs: $failed of $ran blocks failed"; exit 1; }
echo "it_docs: OK ($ran blocks run)"
