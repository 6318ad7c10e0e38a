#!/usr/bin/env bash
# Builds the pinned third-party binaries that tests and the demo run for real,
# into a per-user cache keyed by the pins, and links them into .cache/bin/.
#
# A set is rebuilt only when its go.mod/go.sum change, so a fresh clone on a
# machine that built them once costs nothing. Override the cache location with
# RELAYMESH_TOOLS_CACHE (a directory; it holds no secrets).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${RELAYMESH_TOOLS_CACHE:-$HOME/.cache/relaymesh/bin}
bin="$root/.cache/bin"
mkdir -p "$bin" "$cache"

# key MODULE_DIR -> a short hash of the module's pins
key() { cat "$1/go.mod" "$1/go.sum" | sha256sum | cut -c1-12; }

# build SET_DIR MODULE_DIR NAME PACKAGE [extra env...]
build() {
  local dir=$1 mod=$2 name=$3 pkg=$4
  shift 4
  if [ -x "$dir/$name" ]; then
    echo "tools: $name up to date ($dir)"
  else
    echo "tools: building $name from $pkg (first build is slow; cached afterwards)"
    local start=$SECONDS
    (cd "$mod" && env "$@" go build -trimpath -o "$dir/$name.tmp" "$pkg")
    mv "$dir/$name.tmp" "$dir/$name"
    echo "tools: built $name in $((SECONDS - start))s"
  fi
  ln -sfn "$dir/$name" "$bin/$name"
}

k8s="$cache/k8s-$(key "$root/tools")"
istio="$cache/istio-$(key "$root/tools/istio")"
proto="$cache/proto-$(key "$root/tools/proto")"
pki="$cache/pki-$(key "$root/tools/pki")"
helm="$cache/helm-$(key "$root/tools/helm")"
mkdir -p "$k8s" "$istio" "$proto" "$pki" "$helm"

want=${*:-all}
for t in $want; do
  case $t in
    all)
      "$0" kube-apiserver etcd kubectl controller-gen staticcheck protoc-gen-go protoc-gen-go-grpc istioctl pilot-discovery cfssl step-ca helm ;;
    pki)
      "$0" cfssl step-ca ;;
    kube-apiserver) build "$k8s" "$root/tools" kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver ;;
    kubectl) build "$k8s" "$root/tools" kubectl k8s.io/kubernetes/cmd/kubectl ;;
    etcd) build "$k8s" "$root/tools" etcd go.etcd.io/etcd/server/v3 ;;
    controller-gen) build "$k8s" "$root/tools" controller-gen sigs.k8s.io/controller-tools/cmd/controller-gen ;;
    staticcheck) build "$k8s" "$root/tools" staticcheck honnef.co/go/tools/cmd/staticcheck ;;
    protoc-gen-go) build "$proto" "$root/tools/proto" protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go ;;
    protoc-gen-go-grpc) build "$proto" "$root/tools/proto" protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc ;;
    istioctl) build "$istio" "$root/tools/istio" istioctl istio.io/istio/istioctl/cmd/istioctl CGO_ENABLED=0 ;;
    pilot-discovery) build "$istio" "$root/tools/istio" pilot-discovery istio.io/istio/pilot/cmd/pilot-discovery CGO_ENABLED=0 ;;
    cfssl) build "$pki" "$root/tools/pki" cfssl github.com/cloudflare/cfssl/cmd/cfssl CGO_ENABLED=0 ;;
    step-ca) build "$pki" "$root/tools/pki" step-ca github.com/smallstep/certificates/cmd/step-ca CGO_ENABLED=0 ;;
    helm) build "$helm" "$root/tools/helm" helm helm.sh/helm/v3/cmd/helm CGO_ENABLED=0 ;;
    *) echo "tools: unknown tool $t (known: all pki kube-apiserver etcd kubectl controller-gen staticcheck protoc-gen-go protoc-gen-go-grpc istioctl pilot-discovery cfssl step-ca helm)" >&2; exit 2 ;;
  esac
done
