#!/usr/bin/env bash
# Runs every native Go fuzz target in the module for a fixed time each.
# Usage: hack/fuzz.sh [FUZZTIME]   (default 10s)
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${1:-10s}
found=0
while IFS=: read -r file name; do
  pkg="./$(dirname "$file")"
  echo "fuzz: $pkg $name ($fuzztime)"
  go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "$pkg"
  found=$((found + 1))
done < <(git ls-files '*_test.go' | xargs grep -oE '^func (Fuzz[A-Za-z0-9_]+)' | sed -E 's/func //')
echo "fuzz: ran $found targets"
[ "$found" -gt 0 ]
