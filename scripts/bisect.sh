#!/bin/bash
# Names the first commit of a kernel repository where a corpus entry fails: `git bisect run`
# around a build command and `mlafuzz repro`.
#
#   scripts/bisect.sh --good v1.2 --bad main --build "make -C kernels" \
#     --backends plugin:build/libkernel.so corpus/findings/tolerance-....json
#
# At each commit, in the repository (--repo, default the current folder): the build command runs
# (sh -c); a commit that does not build is skipped (exit 125 to git bisect). Then
# `mlafuzz repro ENTRY [--backends LIST]`: exit 0 (the entry passes: the finding is fixed, or a
# regression entry passes) marks the commit good, exit 1 (it fails) bad, anything else (a backend
# that does not load) skips it. The good revision must pass and the bad one fail; both are checked
# first. The repository is left on the branch it was on.
#
# Exit 0 with "first bad commit: SHA SUBJECT"; 1 when git bisect cannot name one commit (the
# candidates are listed, e.g. commits that did not build); 2 for bad usage or endpoints that do not
# pass and fail.
set -euo pipefail

if [ "${1:-}" = --step ]; then  # one commit, run by git bisect
  if ! sh -c "$BISECT_BUILD" >>"$BISECT_LOG" 2>&1; then
    echo "  tested $(git rev-parse --short HEAD): the build failed: skipped"
    exit 125
  fi
  rc=0
  # shellcheck disable=SC2086
  "$BISECT_MLAFUZZ" repro "$BISECT_ENTRY" $BISECT_BACKENDS >>"$BISECT_LOG" 2>&1 || rc=$?
  case $rc in
    0) echo "  tested $(git rev-parse --short HEAD): the entry passes: good" ;;
    1) echo "  tested $(git rev-parse --short HEAD): the entry fails: bad" ;;
    *) echo "  tested $(git rev-parse --short HEAD): mlafuzz repro exited $rc: skipped"; exit 125 ;;
  esac
  exit "$rc"
fi

usage() {
  echo "usage: $0 --good REV --bad REV --build CMD [--backends LIST] [--repo DIR] [--mlafuzz PATH] ENTRY" >&2
  echo "$0: $1" >&2
  exit 2
}
good="" bad="" build="" backends="" repo=. mlafuzz=${MLAFUZZ:-mlafuzz} entry=""
while [ $# -gt 0 ]; do
  case $1 in
    --good | --bad | --build | --backends | --repo | --mlafuzz)
      [ $# -ge 2 ] || usage "$1 needs a value"
      declare "${1#--}=$2"
      shift 2
      ;;
    -*) usage "unknown option $1" ;;
    *)
      [ -z "$entry" ] || usage "one ENTRY only (also got $1)"
      entry=$1
      shift
      ;;
  esac
done
[ -n "$good" ] && [ -n "$bad" ] && [ -n "$build" ] && [ -n "$entry" ] \
  || usage "--good, --bad, --build and ENTRY are required"
[ -f "$entry" ] || usage "no corpus entry $entry"
command -v "$mlafuzz" >/dev/null || usage "mlafuzz not found: $mlafuzz (--mlafuzz PATH)"
export BISECT_BUILD=$build BISECT_MLAFUZZ BISECT_ENTRY BISECT_BACKENDS="" BISECT_LOG
BISECT_MLAFUZZ=$(realpath "$(command -v "$mlafuzz")")
BISECT_ENTRY=$(realpath "$entry")
[ -z "$backends" ] || BISECT_BACKENDS="--backends $backends"
self=$(realpath "$0")
cd "$repo"
git rev-parse --verify -q "$good^{commit}" >/dev/null || usage "--good $good is not a commit here"
git rev-parse --verify -q "$bad^{commit}" >/dev/null || usage "--bad $bad is not a commit here"
BISECT_LOG=$(mktemp /tmp/mlafuzz-bisect.XXXXXX)
start=$(git symbolic-ref -q --short HEAD || git rev-parse HEAD)
trap 'git bisect reset >/dev/null 2>&1 || true; git checkout -q "$start"' EXIT
echo "bisecting $good..$bad for $entry (build and repro output: $BISECT_LOG, kept unless a commit is named)"

# The endpoints: the good revision passes, the bad one fails.
for end in "$bad:1" "$good:0"; do
  git checkout -q "${end%:*}"
  rc=0
  "$self" --step || rc=$?
  [ "$rc" = "${end#*:}" ] || usage "${end%:*} does not $([ "${end#*:}" = 1 ] && echo fail || echo pass) (exit $rc): nothing to bisect"
done
git checkout -q "$start"

git bisect start "$bad" "$good" >/dev/null
out=$(git bisect run "$self" --step 2>&1) || true
echo "$out" | grep "^  tested " || true
first=$(echo "$out" | sed -n 's/^\([0-9a-f]\{40\}\) is the first bad commit$/\1/p')
if [ -n "$first" ]; then
  echo "first bad commit: $(git log -1 --format='%H %s' "$first")"
  rm -f "$BISECT_LOG"
  exit 0
fi
echo "git bisect could not name one commit:"
echo "$out" | sed -n '/only .skip.ped commits left/,$p'
exit 1
