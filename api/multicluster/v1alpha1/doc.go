// Package v1alpha1 is the multicluster.relaymesh.io API: one
// KubernetesCluster per registered workload cluster.
//
// +kubebuilder:object:generate=true
// +groupName=multicluster.relaymesh.io
package v1alpha1
