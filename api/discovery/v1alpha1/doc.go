// Package v1alpha1 is the discovery.relaymesh.io API: what the server learned
// from the agents' snapshots, one object per mesh, workload and destination,
// named `<name>-<namespace>-<cluster>`. Only the server writes these.
//
// +kubebuilder:object:generate=true
// +groupName=discovery.relaymesh.io
package v1alpha1
