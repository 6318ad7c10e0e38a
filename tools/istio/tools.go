//go:build tools

// Package istio pins Istio's commands for `make tools`.
package istio

import (
	_ "istio.io/istio/istioctl/cmd/istioctl"
	_ "istio.io/istio/pilot/cmd/pilot-discovery"
)
