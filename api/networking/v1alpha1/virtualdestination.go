package v1alpha1

import (
	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// VirtualDestination is a global hostname backed by Destinations in several
// clusters, with static (ordered) or localized failover between them.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rmvd,categories=relaymesh
// +kubebuilder:printcolumn:name="Hostname",type=string,JSONPath=`.spec.hostname`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type VirtualDestination struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   VirtualDestinationSpec `json:"spec"`
	Status PolicyStatus           `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// VirtualDestinationList is a list of VirtualDestinations.
type VirtualDestinationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualDestination `json:"items"`
}

// VirtualDestinationSpec is the global service a VirtualDestination publishes.
// Exactly one of static or localized failover is set.
// +kubebuilder:validation:XValidation:rule="has(self.static) != has(self.localized)",message="exactly one of static or localized must be set"
type VirtualDestinationSpec struct {
	// Hostname clients use, e.g. `reviews.global`.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)+$')",message="must be a DNS name of at least two labels such as reviews.global: lowercase letters, digits and '-' between the dots"
	Hostname string `json:"hostname"`
	// Port clients use.
	Port VirtualDestinationPort `json:"port"`
	// VirtualMesh whose meshes can reach the hostname; omitted: Meshes.
	// +optional
	VirtualMesh *common.ObjectRef `json:"virtualMesh,omitempty"`
	// Meshes that can reach the hostname, when no VirtualMesh is named, each
	// named by its istiod's clusterName, namespace and name.
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Meshes []common.ClusterObjectRef `json:"meshes,omitempty"`
	// Static failover: the listed Destinations in priority order.
	// +optional
	Static *StaticFailover `json:"static,omitempty"`
	// Localized failover: the nearest healthy Destination, with directives.
	// +optional
	Localized *LocalizedFailover `json:"localized,omitempty"`
}

// VirtualDestinationPort is the client-facing port and where it goes.
type VirtualDestinationPort struct {
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Number int32 `json:"number"`
	// +kubebuilder:validation:Enum=HTTP;HTTP2;GRPC;HTTPS;TLS;TCP
	// +kubebuilder:default=HTTP
	// +optional
	Protocol string `json:"protocol,omitempty"`
	// TargetName is the backing Services' port name; omitted: TargetNumber.
	// +kubebuilder:validation:MaxLength=63
	// +optional
	TargetName string `json:"targetName,omitempty"`
	// TargetNumber is the backing Services' port; omitted: Number.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	TargetNumber int32 `json:"targetNumber,omitempty"`
}

// StaticFailover lists backing Services in priority order.
type StaticFailover struct {
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	Destinations []common.ClusterObjectRef `json:"destinations"`
}

// LocalizedFailover sends traffic to the nearest healthy backing Service.
type LocalizedFailover struct {
	// DestinationSelectors choose the backing Services, at most one per cluster.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	DestinationSelectors []common.DestinationSelector `json:"destinationSelectors"`
	// FailoverDirectives override the order between localities.
	// +kubebuilder:validation:MaxItems=64
	// +optional
	FailoverDirectives []FailoverDirective `json:"failoverDirectives,omitempty"`
	// OutlierDetection decides when a backing Service is unhealthy. Defaults:
	// 10 consecutive errors, 5s interval, 120s ejection.
	// +optional
	OutlierDetection *OutlierDetection `json:"outlierDetection,omitempty"`
}

// FailoverDirective sends traffic from one locality to others when it fails.
type FailoverDirective struct {
	From Locality `json:"from"`
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	To []Locality `json:"to"`
}

// Locality is a region, optionally narrowed to a zone and sub-zone.
type Locality struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	Region string `json:"region"`
	// +kubebuilder:validation:MaxLength=128
	// +optional
	Zone string `json:"zone,omitempty"`
	// +kubebuilder:validation:MaxLength=128
	// +optional
	SubZone string `json:"subZone,omitempty"`
}
