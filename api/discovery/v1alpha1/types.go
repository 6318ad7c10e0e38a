package v1alpha1

import (
	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Mesh is an Istio control plane discovered in a workload cluster.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=relaymesh
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.istio.installation.cluster`
// +kubebuilder:printcolumn:name="Trust Domain",type=string,JSONPath=`.spec.istio.trustDomain`
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.spec.istio.installation.version`
type Mesh struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   MeshSpec   `json:"spec"`
	Status MeshStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// MeshList is a list of Meshes.
type MeshList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Mesh `json:"items"`
}

// MeshSpec describes a discovered mesh.
type MeshSpec struct {
	// Istio is set for Istio control planes, the only kind supported today.
	// +optional
	Istio *IstioMesh `json:"istio,omitempty"`
	// AgentNamespace is where the cluster's relay agent runs.
	// +optional
	AgentNamespace string `json:"agentNamespace,omitempty"`
}

// IstioMesh is an istiod installation.
type IstioMesh struct {
	Installation MeshInstallation `json:"installation"`
	// TrustDomain from the mesh config; Istio's default is cluster.local.
	TrustDomain string `json:"trustDomain"`
	// IstiodServiceAccount is the service account istiod runs as.
	// +optional
	IstiodServiceAccount string `json:"istiodServiceAccount,omitempty"`
	// Gateways are the ingress and east-west gateways of the mesh.
	// +optional
	Gateways []GatewayInfo `json:"gateways,omitempty"`
	// SmartDNSProxying is true when the mesh config enables DNS capture.
	// +optional
	SmartDNSProxying bool `json:"smartDNSProxying,omitempty"`
	// Ambient describes the mesh's ambient data plane; nil when istiod
	// runs without PILOT_ENABLE_AMBIENT.
	// +optional
	Ambient *AmbientMesh `json:"ambient,omitempty"`
	// DataPlaneModes are the modes its workloads run in, sorted: sidecar,
	// ambient, or both during a migration.
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:items:Enum=ambient;sidecar
	// +optional
	DataPlaneModes []string `json:"dataPlaneModes,omitempty"`
}

// AmbientMesh is what discovery knows of an ambient data plane.
type AmbientMesh struct {
	// Ztunnel is true when a ztunnel DaemonSet runs in the istiod's
	// namespace.
	// +optional
	Ztunnel bool `json:"ztunnel,omitempty"`
	// Waypoints are the Gateways of class istio-waypoint in the cluster.
	// +kubebuilder:validation:MaxItems=1024
	// +optional
	Waypoints []WaypointInfo `json:"waypoints,omitempty"`
	// Network is the mesh's network: the topology.istio.io/network label
	// of istiod's namespace; empty when it has none.
	// +optional
	Network string `json:"network,omitempty"`
	// EastWestGateways are the Gateways of class istio-east-west of the
	// mesh's revision that carry a network and an HBONE listener: where
	// other networks reach its global services.
	// +kubebuilder:validation:MaxItems=64
	// +optional
	EastWestGateways []EastWestGatewayInfo `json:"eastWestGateways,omitempty"`
	// MultiNetwork is true when istiod runs with
	// AMBIENT_ENABLE_MULTI_NETWORK=true.
	// +optional
	MultiNetwork bool `json:"multiNetwork,omitempty"`
	// GlobalServiceScope is true when the mesh config's
	// serviceScopeConfigs make Services labelled istio.io/global=true
	// global (the ambient profile's entry).
	// +optional
	GlobalServiceScope bool `json:"globalServiceScope,omitempty"`
}

// EastWestGatewayInfo is an ambient east-west gateway.
type EastWestGatewayInfo struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	// Network is its topology.istio.io/network label.
	Network string `json:"network"`
	// Addresses are its status.addresses (IPs or hostnames); empty until
	// it is programmed.
	// +kubebuilder:validation:MaxItems=16
	// +optional
	Addresses []string `json:"addresses,omitempty"`
	// HBONEPort is its HBONE listener's port.
	HBONEPort int32 `json:"hbonePort"`
	// ServiceAccount its pods run as.
	// +optional
	ServiceAccount string `json:"serviceAccount,omitempty"`
}

// WaypointInfo is an ambient L7 proxy.
type WaypointInfo struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	// TrafficType is what it serves (istio.io/waypoint-for).
	// +kubebuilder:validation:Enum=service;workload;all;none
	TrafficType string `json:"trafficType"`
	// ServiceAccount of its pods; empty when unknown.
	// +optional
	ServiceAccount string `json:"serviceAccount,omitempty"`
	// Ready is true once its Gateway has status.addresses (istiod ignores
	// it until then).
	// +optional
	Ready bool `json:"ready,omitempty"`
}

// WaypointRef names the waypoint a Service or workload is bound to
// (istio.io/use-waypoint), in the same cluster.
type WaypointRef struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
}

// Data-plane modes of a workload.
const (
	DataPlaneSidecar = "sidecar"
	DataPlaneAmbient = "ambient"
	// DataPlaneMixed is a Destination whose workloads run in both modes.
	DataPlaneMixed = "mixed"
)

// LabelRouteAPI, on a Kubernetes Service in a workload cluster, chooses the
// API its TrafficPolicies are written in (docs/design/2026-12-02-ambient-translation.md):
// RouteAPIGatewayAPI opts a sidecar Destination into Gateway API routes
// (HTTPRoute/GRPCRoute with the Service as parent) instead of Istio's
// VirtualService; RouteAPIIstio, or no label, keeps the VirtualService.
// An ambient or mixed Destination is always routed by Gateway API.
const (
	LabelRouteAPI      = "relaymesh.io/route-api"
	RouteAPIGatewayAPI = "gateway-api"
	RouteAPIIstio      = "istio"
)

// MeshInstallation locates a control plane: the istiod Deployment Name in
// Namespace of Cluster. VirtualMeshes and VirtualDestinations name meshes by
// these three values.
type MeshInstallation struct {
	// Name of the istiod Deployment.
	// +optional
	Name      string `json:"name,omitempty"`
	Namespace string `json:"namespace"`
	Cluster   string `json:"cluster"`
	// Revision is the `istio.io/rev` of the control plane; empty: default.
	// +optional
	Revision string `json:"revision,omitempty"`
	// +optional
	Version string `json:"version,omitempty"`
	// +optional
	PodLabels map[string]string `json:"podLabels,omitempty"`
	// +optional
	Region string `json:"region,omitempty"`
}

// GatewayInfo is a gateway of a mesh.
type GatewayInfo struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	// +kubebuilder:validation:Enum=Ingress;EastWest
	Kind string `json:"kind"`
	// +optional
	WorkloadLabels map[string]string `json:"workloadLabels,omitempty"`
	// ExternalAddress is the gateway's reachable IP or DNS name.
	// +optional
	ExternalAddress string `json:"externalAddress,omitempty"`
	// TLSPort is the external port carrying mTLS passthrough traffic.
	// +optional
	TLSPort int32 `json:"tlsPort,omitempty"`
}

// MeshStatus is what the server applied to a Mesh.
type MeshStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// AppliedVirtualMesh is the VirtualMesh the mesh belongs to.
	// +optional
	AppliedVirtualMesh *common.ObjectRef `json:"appliedVirtualMesh,omitempty"`
}

// Workload is a sidecar-injected Deployment, StatefulSet or DaemonSet.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=relaymesh
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.kubernetes.controller.clusterName`
// +kubebuilder:printcolumn:name="Kind",type=string,JSONPath=`.spec.kubernetes.kind`
// +kubebuilder:printcolumn:name="Service Account",type=string,JSONPath=`.spec.kubernetes.serviceAccountName`
type Workload struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   WorkloadSpec   `json:"spec"`
	Status WorkloadStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// WorkloadList is a list of Workloads.
type WorkloadList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Workload `json:"items"`
}

// WorkloadSpec describes a discovered workload.
type WorkloadSpec struct {
	Kubernetes KubernetesWorkload `json:"kubernetes"`
	// Mesh is the Mesh object (in the management cluster) whose sidecars the
	// workload runs.
	Mesh common.ObjectRef `json:"mesh"`
}

// KubernetesWorkload is the controller of a group of pods.
type KubernetesWorkload struct {
	Controller common.ClusterObjectRef `json:"controller"`
	// +kubebuilder:validation:Enum=Deployment;StatefulSet;DaemonSet
	Kind string `json:"kind"`
	// +optional
	PodLabels map[string]string `json:"podLabels,omitempty"`
	// +optional
	ServiceAccountName string `json:"serviceAccountName,omitempty"`
	// DataPlaneMode is sidecar (injected) or ambient (captured by
	// ztunnel); empty means sidecar.
	// +kubebuilder:validation:Enum=sidecar;ambient
	// +optional
	DataPlaneMode string `json:"dataPlaneMode,omitempty"`
	// Waypoint its pods are bound to, if any.
	// +optional
	Waypoint *WaypointRef `json:"waypoint,omitempty"`
}

// WorkloadStatus is what the server applied to a Workload.
type WorkloadStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// Destination is a Service that selects mesh workloads.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=relaymesh
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.kubeService.ref.clusterName`
// +kubebuilder:printcolumn:name="Service",type=string,JSONPath=`.spec.kubeService.ref.name`
type Destination struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   DestinationSpec   `json:"spec"`
	Status DestinationStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// DestinationList is a list of Destinations.
type DestinationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Destination `json:"items"`
}

// DestinationSpec describes a discovered destination.
type DestinationSpec struct {
	KubeService KubeService `json:"kubeService"`
	// Mesh is the Mesh of the selected workloads.
	Mesh common.ObjectRef `json:"mesh"`
}

// KubeService is a Kubernetes Service.
type KubeService struct {
	Ref common.ClusterObjectRef `json:"ref"`
	// WorkloadSelectorLabels is the Service's pod selector.
	// +optional
	WorkloadSelectorLabels map[string]string `json:"workloadSelectorLabels,omitempty"`
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// +optional
	Ports []ServicePort `json:"ports,omitempty"`
	// Subsets are the label values that tell the selected workloads apart,
	// e.g. version: [v1, v2, v3].
	// +optional
	Subsets map[string][]string `json:"subsets,omitempty"`
	// +optional
	ServiceType string `json:"serviceType,omitempty"`
	// +optional
	ExternalAddresses []string `json:"externalAddresses,omitempty"`
	// Endpoints are the Service's ready pods, sorted by IP: what
	// flat-network federation sends traffic to directly.
	// +kubebuilder:validation:MaxItems=10000
	// +optional
	Endpoints []Endpoint `json:"endpoints,omitempty"`
	// Waypoint the Service is bound to, if any.
	// +optional
	Waypoint *WaypointRef `json:"waypoint,omitempty"`
	// DataPlaneMode of the workloads it selects: sidecar, ambient, or mixed
	// (both, during a migration); empty means sidecar. Its ready pods count
	// too: a pod that still runs with a sidecar behind ambient workloads (or
	// one captured by ztunnel behind sidecar workloads) makes it mixed.
	// +kubebuilder:validation:Enum=sidecar;ambient;mixed
	// +optional
	DataPlaneMode string `json:"dataPlaneMode,omitempty"`
	// Headless is true for a Service without a cluster IP (clusterIP:
	// None): its clients connect to the pod IPs, so a waypoint bound to
	// the Service (for service traffic) is not in their path.
	// +optional
	Headless bool `json:"headless,omitempty"`
}

// Endpoint is a ready pod behind a Service.
type Endpoint struct {
	// IP is the pod's IP address.
	IP string `json:"ip"`
	// Labels are the pod's labels, which subsets select endpoints by.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// Ambient is true when istio-cni captured the pod.
	// +optional
	Ambient bool `json:"ambient,omitempty"`
}

// ServicePort is a port of a Service.
type ServicePort struct {
	Port int32 `json:"port"`
	// +optional
	Name string `json:"name,omitempty"`
	// +optional
	Protocol string `json:"protocol,omitempty"`
	// +optional
	AppProtocol string `json:"appProtocol,omitempty"`
	// +optional
	TargetPort string `json:"targetPort,omitempty"`
}

// DestinationStatus is what the server applied to a Destination.
type DestinationStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// AppliedTrafficPolicies in the order they apply.
	// +optional
	AppliedTrafficPolicies []common.ObjectRef `json:"appliedTrafficPolicies,omitempty"`
	// AppliedAccessPolicies that allow access to the Destination.
	// +optional
	AppliedAccessPolicies []common.ObjectRef `json:"appliedAccessPolicies,omitempty"`
	// LocalFQDN is the in-cluster hostname.
	// +optional
	LocalFQDN string `json:"localFQDN,omitempty"`
	// FederatedHostname is the cross-cluster hostname, if federated.
	// +optional
	FederatedHostname string `json:"federatedHostname,omitempty"`
	// FederatedToMeshes lists the meshes that can reach it.
	// +optional
	FederatedToMeshes []common.ObjectRef `json:"federatedToMeshes,omitempty"`
}
