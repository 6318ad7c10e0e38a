// Package v1alpha1 is the discovery.relaymesh.io API: what the server learned
// from the agents' snapshots, one object per mesh, workload and destination.
// Each is named by Name: a readable prefix and a hash of exactly where it came
// from (kind, cluster, namespace, name), which its labels and spec also carry.
// Only the server writes these.
//
// +kubebuilder:object:generate=true
// +groupName=discovery.relaymesh.io
package v1alpha1
