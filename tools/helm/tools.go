//go:build tools

// Package tools pins Helm v3, which the chart tests (test/helm) run as a
// binary: `helm lint --strict`, `helm template`, `helm install`, `helm
// upgrade` against the local kube-apiservers. Built by `make tools`.
package helm

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
