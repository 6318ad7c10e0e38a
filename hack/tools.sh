#!/usr/bin/env bash
# Builds the pinned third-party binaries that tests and the demo run for real,
# into a per-user cache keyed by the pins, and links them into .cache/bin/.
#
# Usage: hack/tools.sh [TOOL|SET]...   (default: all)
#   SET  all   every tool (`make tools`, CI)
#        demo  what `make demo` runs: kube-apiserver, etcd, kubectl
#        pki   cfssl, step-ca
#        spire spire-server, spire-agent (cgo: SQLite; make deps installs gcc)
#
# A set is rebuilt only when its go.mod/go.sum change, so a fresh clone on a
# machine that built them once costs nothing. The missing tools of one module
# are built by one `go build`, so its compiles and links share both cores.
# Override the cache location with RELAYMESH_TOOLS_CACHE (a directory; it
# holds no secrets).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=hack/lib.sh
. "$root/hack/lib.sh"
cache=${RELAYMESH_TOOLS_CACHE:-$HOME/.cache/relaymesh/bin}
bin="$root/.cache/bin"
mkdir -p "$bin" "$cache"

# One line per tool: its name, the module (under tools/) that pins it, the
# package, and the environment of its build.
tools=(
  "kube-apiserver      .        k8s.io/kubernetes/cmd/kube-apiserver"
  "etcd                .        go.etcd.io/etcd/server/v3"
  "kubectl             .        k8s.io/kubernetes/cmd/kubectl"
  "controller-gen      .        sigs.k8s.io/controller-tools/cmd/controller-gen"
  "staticcheck         .        honnef.co/go/tools/cmd/staticcheck"
  "protoc-gen-go       proto    google.golang.org/protobuf/cmd/protoc-gen-go"
  "protoc-gen-go-grpc  proto    google.golang.org/grpc/cmd/protoc-gen-go-grpc"
  "istioctl            istio    istio.io/istio/istioctl/cmd/istioctl              CGO_ENABLED=0"
  "pilot-discovery     istio    istio.io/istio/pilot/cmd/pilot-discovery         CGO_ENABLED=0"
  "cfssl               pki      github.com/cloudflare/cfssl/cmd/cfssl             CGO_ENABLED=0"
  "step-ca             pki      github.com/smallstep/certificates/cmd/step-ca     CGO_ENABLED=0"
  "helm                helm     helm.sh/helm/v3/cmd/helm                          CGO_ENABLED=0"
  "spire-server        spire    github.com/spiffe/spire/cmd/spire-server          CGO_ENABLED=1"
  "spire-agent         spire    github.com/spiffe/spire/cmd/spire-agent           CGO_ENABLED=1"
)
declare -A sets=(
  [demo]="kube-apiserver etcd kubectl"
  [pki]="cfssl step-ca"
  [spire]="spire-server spire-agent"
)
# The cache directory of each module: its name and a short hash of its pins.
declare -A prefix=([.]=k8s [proto]=proto [istio]=istio [pki]=pki [helm]=helm [spire]=spire)

names=()
declare -A mod pkg buildenv
for line in "${tools[@]}"; do
  read -r n m p e <<<"$line"
  names+=("$n")
  mod[$n]=$m pkg[$n]=$p buildenv[$n]=${e:-}
done

# The tools asked for, each once, in the table's order.
declare -A want=()
for t in "${@:-all}"; do
  case $t in
    all) for n in "${names[@]}"; do want[$n]=1; done ;;
    *)
      if [ -n "${sets[$t]:-}" ]; then
        for n in ${sets[$t]}; do want[$n]=1; done
      elif [ -n "${mod[$t]:-}" ]; then
        want[$t]=1
      else
        echo "tools: unknown tool $t (known: all ${!sets[*]} ${names[*]})" >&2
        exit 2
      fi
      ;;
  esac
done

# exec_name PACKAGE -> the file name `go build -o DIR/` gives its binary
# (example.com/cmd/v3 is "cmd", as cmd/go names it).
exec_name() {
  local base=${1##*/}
  if [[ $base =~ ^v[0-9]+$ && $base != v0 && $base != v1 ]]; then
    base=${1%/*}
    base=${base##*/}
  fi
  echo "$base"
}

# key MODULE_DIR -> a short hash of the module's pins
key() { cat "$1/go.mod" "$1/go.sum" | sha256sum | cut -c1-12; }

tmp=""
trap '[ -z "$tmp" ] || rm -rf "$tmp"' EXIT

for m in . proto istio pki helm spire; do
  moddir=$root/tools/$m
  moddir=${moddir%/.}
  dir="$cache/${prefix[$m]}-$(key "$moddir")"
  missing=() pkgs=() have=() envs=()
  for n in "${names[@]}"; do
    [ -n "${want[$n]:-}" ] && [ "${mod[$n]}" = "$m" ] || continue
    if [ -x "$dir/$n" ]; then
      have+=("$n")
    else
      missing+=("$n")
      pkgs+=("${pkg[$n]}")
      # The tools of one module share one environment (the table says so).
      [ -z "${buildenv[$n]}" ] || envs=("${buildenv[$n]}")
    fi
  done
  [ ${#have[@]} -eq 0 ] || echo "tools: ${have[*]} up to date ($dir)"
  if [ ${#missing[@]} -gt 0 ]; then
    mkdir -p "$dir"
    echo "tools: building ${missing[*]} from ${moddir#"$root"/} (slow the first time; cached in $dir afterwards)"
    start=$SECONDS
    tmp=$(mktemp -d "$dir/.build.XXXXXX")
    (
      cd "$moddir"
      [ ${#envs[@]} -eq 0 ] || export "${envs[@]}"
      # No symbol table or DWARF: nobody debugs these, and the linker of a
      # kube-apiserver spends a good part of its time writing them.
      quiet_go tools build -trimpath -ldflags="-s -w" -o "$tmp/" "${pkgs[@]}"
    )
    for n in "${missing[@]}"; do
      mv "$tmp/$(exec_name "${pkg[$n]}")" "$dir/$n"
    done
    rm -rf "$tmp"
    tmp=""
    echo "tools: built ${missing[*]} in $(clock $((SECONDS - start)))"
  fi
  for n in "${have[@]}" "${missing[@]}"; do
    ln -sfn "$dir/$n" "$bin/$n"
  done
done
