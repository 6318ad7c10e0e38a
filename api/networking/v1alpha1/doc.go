// Package v1alpha1 is the networking.relaymesh.io API: the objects users
// write to federate meshes (VirtualMesh), shape traffic (TrafficPolicy),
// allow access (AccessPolicy) and publish global services (VirtualDestination).
//
// +kubebuilder:object:generate=true
// +groupName=networking.relaymesh.io
package v1alpha1
