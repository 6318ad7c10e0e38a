// Package security holds Go generated (hack/gen-workloadapi.sh) from
// Istio's authorization.proto, istio.security.Authorization: the L4
// policies istiod serves a ztunnel over delta xDS.
package security
