// Package v1alpha1 holds the types shared by every Relaymesh API group:
// object references, selectors and the approval status every user-facing
// object reports. It registers no kind of its own.
//
// +kubebuilder:object:generate=true
package v1alpha1
