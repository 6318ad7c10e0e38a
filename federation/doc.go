// Package federation translates VirtualMeshes into Istio configuration:
// ServiceEntries, DestinationRules and Gateways for cross-cluster service
// federation, failover, and the mTLS/shared-trust outputs. Translators are
// pure functions from an input snapshot to an output set and a status report.
//
// Status: not yet implemented; the translation issue builds it.
package federation
