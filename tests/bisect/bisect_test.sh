#!/bin/bash
# scripts/bisect.sh on a throwaway kernel repository made here: the example C plugin, correct at
# first; a commit that does not build, one that fixes the build, then a commit that plants a bug
# (the softmax denominator 6 % too large). A campaign at the last commit finds the bug; the
# bisect of its corpus entry must name the planting commit, having skipped the one that does not
# build.
# Usage: bisect_test.sh MLAFUZZ REPO_ROOT
set -euo pipefail
mlafuzz=$(realpath "$1")
root=$(realpath "$2")
work=$(mktemp -d /tmp/mlafuzz-bisect-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

repo=$work/kernel
mkdir -p "$repo"
cd "$repo"
git init -q
git config user.name "bisect test"
git config user.email "bisect@test.invalid"
commit() { git add -A && git commit -q -m "$1" && git rev-parse HEAD; }
cp "$root/examples/cpu_plugin/cpu_plugin.c" kernel.c
echo "libk.so" >.gitignore
echo "a kernel" >README
good=$(commit "kernel: the example plugin")
echo "notes" >>README
commit "docs: notes" >/dev/null
echo "more notes" >>README
commit "docs: more notes" >/dev/null
echo "this line does not compile;" >>kernel.c
broken=$(commit "kernel: start a refactoring (does not build)")
sed -i '$d' kernel.c
commit "kernel: finish the refactoring" >/dev/null
grep -q 'acc\[d\] / denom' kernel.c || fail "the example plugin changed: no 'acc[d] / denom' to plant a bug in"
sed -i 's|acc\[d\] / denom|acc[d] / (denom * 1.0625f)|' kernel.c
planted=$(commit "kernel: fold the scale into the denominator")
echo "even more notes" >>README
commit "docs: even more notes" >/dev/null

build="cc -shared -fPIC -std=c11 -O1 -ffp-contract=off -I$root/include -o libk.so kernel.c -lm"
sh -c "$build" || fail "the last commit does not build"
# Tonight's campaign at the last commit finds the bug and saves its corpus entry.
rc=0
"$mlafuzz" fuzz --backends plugin:libk.so --properties tolerance --cases 3 --seed 1 --jobs 1 \
  --shrink-evals 20 --corpus "$work/corpus" --report "$work/report" --progress plain \
  >"$work/fuzz.log" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "the campaign did not find the planted bug (exit $rc): $(cat "$work/fuzz.log")"
entry=$(ls "$work"/corpus/*.json | head -1)

cd "$work"
out=$("$root/scripts/bisect.sh" --good "$good" --bad HEAD --repo "$repo" --build "$build" \
  --backends plugin:libk.so --mlafuzz "$mlafuzz" "$entry" 2>&1) || fail "bisect failed: $out"
echo "$out"
echo "$out" | grep -q "^first bad commit: $planted kernel: fold the scale into the denominator$" \
  || fail "bisect did not name $planted"
echo "$out" | grep -q "^  tested ${broken:0:7}: the build failed: skipped$" \
  || fail "the commit that does not build ($broken) was not skipped"
[ "$(git -C "$repo" rev-parse --abbrev-ref HEAD)" = "$(git -C "$repo" symbolic-ref --short HEAD)" ] \
  || fail "the repository was not left on its branch"
git -C "$repo" bisect log >/dev/null 2>&1 && fail "a bisect is still in progress"

# Endpoints that do not pass and fail are refused.
rc=0
"$root/scripts/bisect.sh" --good HEAD --bad "$good" --repo "$repo" --build "$build" \
  --backends plugin:libk.so --mlafuzz "$mlafuzz" "$entry" >"$work/bad.log" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "does not fail" "$work/bad.log" || fail "swapped endpoints: exit $rc, $(cat "$work/bad.log")"
rm -f "$(sed -n 's/.*(build and repro output: \([^,]*\),.*/\1/p' "$work/bad.log")"
echo "bisect test passed"
