#!/usr/bin/env bash
# Installs the Debian packages a make target needs when they are missing, the
# way hack/tools.sh builds the pinned binaries: `make test`, `make demo`,
# `make gen` and `make image` call it first, and .ci/run calls it too.
#
# Usage: hack/deps.sh [--check] TARGET...
#   TARGET   test, demo, gen, image or all
#   --check  only report what is missing (exit 1 if anything is); install nothing
#
# It installs with apt-get, as root or through `sudo -n`; anything else (no
# apt-get, not root and no password-less sudo) fails with the command to run
# by hand. It prints every package it installs, and checks afterwards that
# what each package provides is really there.
set -euo pipefail

# One line per package: the package, the targets that need it, and what is
# present once it is installed (cmd:NAME on PATH, or file:PATH). Adding a
# package for a target is a one-line change here.
deps=(
  "gcc                test               cmd:gcc"                                 # go test -race, cgo (miekg/pkcs11)
  "softhsm2           test               cmd:softhsm2-util"                       # ca/hsm, trust: a real PKCS#11 token
  "protobuf-compiler  gen                cmd:protoc"                              # relay/proto
  "ca-certificates    test,demo,image    file:/etc/ssl/certs/ca-certificates.crt" # go's module downloads (HTTPS), the image's CA bundle
  "chromium           test               cmd:chromium"                            # dashboard: browser tests, make screenshots
  "redis-server       test               cmd:redis-server"                        # the replicas' snapshot store (server/snapshots, test/ha)
)

targets=(test demo gen image)

usage() {
  echo "usage: hack/deps.sh [--check] TARGET...   (TARGET: ${targets[*]} all)" >&2
  exit 2
}

check_only=0
want=()
for a in "$@"; do
  case $a in
    --check) check_only=1 ;;
    all) want+=("${targets[@]}") ;;
    test | demo | gen | image) want+=("$a") ;;
    *) echo "deps: unknown target $a" >&2; usage ;;
  esac
done
[ ${#want[@]} -gt 0 ] || usage

# present CHECK -> 0 when what the package provides is there
present() {
  case $1 in
    cmd:*) command -v "${1#cmd:}" >/dev/null 2>&1 ;;
    file:*) [ -s "${1#file:}" ] ;;
    *) echo "deps: bad check $1" >&2; exit 2 ;;
  esac
}

# needed TARGETS -> 0 when one of the wanted targets is in the comma list
needed() {
  local t
  for t in "${want[@]}"; do
    case ",$1," in *",$t,"*) return 0 ;; esac
  done
  return 1
}

missing=() checks=()
for line in "${deps[@]}"; do
  read -r pkg for check _ <<<"$line"
  needed "$for" || continue
  if ! present "$check"; then
    missing+=("$pkg")
    checks+=("$check")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: nothing to install for ${want[*]}"
  exit 0
fi
if [ $check_only = 1 ]; then
  echo "deps: missing for ${want[*]}: ${missing[*]} (run: make deps)"
  exit 1
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "deps: ${want[*]} need the Debian packages ${missing[*]}, and there is no apt-get here;" >&2
  echo "deps: install their equivalents (${checks[*]}) by hand" >&2
  exit 1
fi
sudo=()
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
  else
    echo "deps: ${want[*]} need the Debian packages ${missing[*]}; installing them needs root." >&2
    echo "deps: run as root, or: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi

# retry CMD...: a mirror that fails once should not fail the set-up.
retry() {
  local i
  for i in 1 2 3; do
    "$@" && return 0
    echo "deps: $* failed (attempt $i of 3)" >&2
    sleep $((i * 5))
  done
  return 1
}

echo "deps: installing ${missing[*]} (for ${want[*]})"
export DEBIAN_FRONTEND=noninteractive
retry "${sudo[@]}" apt-get update -qq
retry "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"

failed=()
for i in "${!missing[@]}"; do
  present "${checks[$i]}" || failed+=("${missing[$i]} (${checks[$i]})")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "deps: installed, but still missing: ${failed[*]}" >&2
  exit 1
fi
echo "deps: installed ${missing[*]}"
