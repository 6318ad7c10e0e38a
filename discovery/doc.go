// Package discovery runs in the agent: it watches its cluster with informers
// and builds discovery snapshots of Istio meshes, sidecar-injected workloads
// and the Services that select them.
//
// Status: not yet implemented; the relay data path issue builds it.
package discovery
