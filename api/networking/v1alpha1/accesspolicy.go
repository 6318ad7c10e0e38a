package v1alpha1

import (
	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AccessPolicy allows selected source identities to reach selected
// Destinations. AccessPolicies only add access; with the VirtualMesh's
// globalAccessPolicy Enabled, what no AccessPolicy allows is denied.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rmap,categories=relaymesh
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type AccessPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   AccessPolicySpec `json:"spec"`
	Status PolicyStatus     `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// AccessPolicyList is a list of AccessPolicies.
type AccessPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AccessPolicy `json:"items"`
}

// AccessPolicySpec is what an AccessPolicy allows.
type AccessPolicySpec struct {
	// SourceSelector chooses the identities allowed; omitted: every workload
	// of the Destination's VirtualMesh.
	// +kubebuilder:validation:MaxItems=64
	// +optional
	SourceSelector []common.IdentitySelector `json:"sourceSelector,omitempty"`
	// DestinationSelector chooses the Destinations; omitted: all.
	// +kubebuilder:validation:MaxItems=64
	// +optional
	DestinationSelector []common.DestinationSelector `json:"destinationSelector,omitempty"`
	// AllowedPaths: exact paths, `prefix*`, or `*suffix`; omitted: any path.
	// +kubebuilder:validation:MaxItems=128
	// +kubebuilder:validation:items:MaxLength=1024
	// +optional
	AllowedPaths []string `json:"allowedPaths,omitempty"`
	// AllowedMethods: HTTP methods; omitted: any method.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:Enum=GET;HEAD;POST;PUT;DELETE;CONNECT;OPTIONS;TRACE;PATCH
	// +optional
	AllowedMethods []string `json:"allowedMethods,omitempty"`
	// AllowedPorts: destination ports; omitted: any port.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:Minimum=1
	// +kubebuilder:validation:items:Maximum=65535
	// +optional
	AllowedPorts []int32 `json:"allowedPorts,omitempty"`
}
