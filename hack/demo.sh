#!/usr/bin/env bash
# `make demo`: builds only what the demo runs, quietly, with one heading per
# step and the time since the start, then runs the demo (test/cmd/demo).
#
#   1. the Debian packages the demo needs (hack/deps.sh demo: none today);
#   2. kube-apiserver, etcd and kubectl (hack/tools.sh demo), cached per pin in
#      ~/.cache/relaymesh/bin — the other pinned tools are for `make test`;
#   3. relaymesh and the demo, into bin/ (built while step 2 runs: the two
#      builds share the machine's cores, and one's downloads and links fill
#      the other's idle time);
#   4. bin/demo, which keeps the clusters up until Ctrl-C (DEMO_EXIT=1: it
#      stops after the summary).
#
# `go: downloading` lines are counted, not shown (hack/lib.sh quiet_go); every
# other line go prints, errors above all, is shown.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=hack/lib.sh
. hack/lib.sh

started=$(date +%s)
heading() { printf '\n%s ==> %s\n' "$(clock $(($(date +%s) - started)))" "$*"; }

heading "Debian packages the demo needs (hack/deps.sh demo)"
hack/deps.sh demo

mkdir -p .cache/demo
log=.cache/demo/build.log
heading "Building relaymesh and the demo into bin/, in the background (log: $log)"
# In a process group of its own, so that Ctrl-C or a failed step ends all of
# it (go and the compilers it runs). -trimpath as hack/tools.sh: the two
# builds then share the standard library's compiled packages (and any other
# package whose whole dependency graph they share); no symbol table or DWARF,
# as in the image (make image): a shorter link.
setsid bash -c '. hack/lib.sh && quiet_go demo build -trimpath -ldflags="-s -w" -o bin/ ./cmd/relaymesh ./test/cmd/demo' >"$log" 2>&1 &
build=$!
trap 'kill -- -"$build" 2>/dev/null || true' EXIT
trap 'exit 130' INT TERM

heading "kube-apiserver, etcd and kubectl (hack/tools.sh demo): the first build takes about 16 minutes on 2 cores, later ones none"
hack/tools.sh demo

heading "Waiting for relaymesh and the demo"
if ! wait "$build"; then
  cat "$log" >&2
  echo "demo: building relaymesh and the demo failed (above; also in $log)" >&2
  exit 1
fi
trap - EXIT INT TERM
cat "$log"

heading "Running the demo (bin/demo: keeps the clusters up until Ctrl-C; DEMO_EXIT=1 stops after the summary)"
exec bin/demo -relaymesh bin/relaymesh -started "$started"
