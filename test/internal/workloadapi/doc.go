// Package workloadapi holds Go generated (hack/gen-workloadapi.sh, run by
// `make gen`) from Istio's workload API, istio.workload.* in workload.proto:
// the Address resources istiod serves a ztunnel over delta xDS. Tests decode
// istiod's answers with it, so the main module needs no istio.io/istio.
// The protos are Istio's (Apache-2.0, header kept in the generated files).
package workloadapi
