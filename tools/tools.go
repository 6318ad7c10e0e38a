//go:build tools

// Package tools pins the third-party commands that `make tools` builds. It is
// never compiled into Relaymesh; the blank imports only keep go.mod honest.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "honnef.co/go/tools/cmd/staticcheck"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "sigs.k8s.io/controller-tools/cmd/controller-gen"
)
