package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// ObjectRef names an object in the management cluster.
type ObjectRef struct {
	// (Patterns, not CEL rules with readable messages as the scalar fields
	// of the specs have: ObjectRef and ClusterObjectRef are items of long
	// lists, where a rule's estimated cost is over the apiserver's budget.)
	// Name of the object.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Name string `json:"name"`
	// Namespace of the object; empty means the namespace of the referring object.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	Namespace string `json:"namespace,omitempty"`
}

// ClusterObjectRef names an object in a registered workload cluster by
// exactly where it is. A mesh is named by its control plane: the istiod
// Deployment's name and namespace in its cluster.
type ClusterObjectRef struct {
	// Name of the object.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Name string `json:"name"`
	// Namespace of the object in its cluster.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespace string `json:"namespace"`
	// ClusterName is the name of the KubernetesCluster that holds the object.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	ClusterName string `json:"clusterName"`
}

// KubeServiceMatcher selects Services by labels, namespaces and clusters.
// Every field that is set must match; an omitted field matches anything.
type KubeServiceMatcher struct {
	// Labels the Service must carry.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// Namespaces the Service may be in.
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`
	// Clusters the Service may be in.
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Clusters []string `json:"clusters,omitempty"`
}

// KubeServiceRefs selects Services by exact reference.
type KubeServiceRefs struct {
	// Services to select.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=1024
	Services []ClusterObjectRef `json:"services"`
}

// DestinationSelector selects Destinations (Services discovered in workload
// clusters) by matcher or by reference; exactly one must be set.
// +kubebuilder:validation:XValidation:rule="has(self.kubeServiceMatcher) != has(self.kubeServiceRefs)",message="exactly one of kubeServiceMatcher or kubeServiceRefs must be set"
type DestinationSelector struct {
	// +optional
	KubeServiceMatcher *KubeServiceMatcher `json:"kubeServiceMatcher,omitempty"`
	// +optional
	KubeServiceRefs *KubeServiceRefs `json:"kubeServiceRefs,omitempty"`
}

// WorkloadSelector selects workloads by pod labels, namespaces and clusters.
// Every field that is set must match; an omitted field matches anything.
type WorkloadSelector struct {
	// Labels the workload's pods must carry.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// Namespaces the workload may be in.
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`
	// Clusters the workload may be in.
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Clusters []string `json:"clusters,omitempty"`
}

// KubeIdentityMatcher selects workload identities by namespace and cluster.
type KubeIdentityMatcher struct {
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Clusters []string `json:"clusters,omitempty"`
}

// KubeServiceAccountRefs selects workload identities by service account.
type KubeServiceAccountRefs struct {
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=1024
	ServiceAccounts []ClusterObjectRef `json:"serviceAccounts"`
}

// IdentitySelector selects the identities (service accounts) of source
// workloads, or identities of foreign SPIFFE trust domains; exactly one
// field must be set.
// +kubebuilder:validation:XValidation:rule="[has(self.kubeIdentityMatcher), has(self.kubeServiceAccountRefs), has(self.spiffeIDs)].filter(x, x).size() == 1",message="exactly one of kubeIdentityMatcher, kubeServiceAccountRefs or spiffeIDs must be set"
type IdentitySelector struct {
	// +optional
	KubeIdentityMatcher *KubeIdentityMatcher `json:"kubeIdentityMatcher,omitempty"`
	// +optional
	KubeServiceAccountRefs *KubeServiceAccountRefs `json:"kubeServiceAccountRefs,omitempty"`
	// SpiffeIDs are identities of foreign SPIFFE trust domains (a SPIRE
	// server's workloads): whole SPIFFE IDs with a path, no wildcard. A Destination admits one only when its
	// VirtualMesh names the trust domain in
	// spec.mtls.federatedTrustDomains (its status says why not otherwise),
	// and never on ambient workloads.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=2048
	// +kubebuilder:validation:items:Pattern=`^spiffe://[a-z0-9._-]+/[^*]+$`
	// +listType=set
	// +optional
	SpiffeIDs []string `json:"spiffeIDs,omitempty"`
}

// ApprovalState says whether Relaymesh accepted an object.
// +kubebuilder:validation:Enum=Pending;Accepted;Invalid;Failed
type ApprovalState string

const (
	// StatePending means the object has not been processed yet.
	StatePending ApprovalState = "Pending"
	// StateAccepted means the object is valid and its outputs are applied.
	StateAccepted ApprovalState = "Accepted"
	// StateInvalid means the object is wrong or conflicts with an earlier one;
	// it produces no output. The errors say why.
	StateInvalid ApprovalState = "Invalid"
	// StateFailed means the object is valid but Relaymesh failed to apply it.
	StateFailed ApprovalState = "Failed"
)

// Status is the part of status every user-facing object carries.
type Status struct {
	// ObservedGeneration is the metadata.generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// State is the overall verdict.
	// +optional
	State ApprovalState `json:"state,omitempty"`
	// Conditions are the standard Kubernetes conditions.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Errors explain an Invalid or Failed state, most important first.
	// +optional
	Errors []string `json:"errors,omitempty"`
	// Warnings are about an Accepted object that may not do what its author
	// meant, e.g. a selector that matches nothing.
	// +optional
	Warnings []string `json:"warnings,omitempty"`
	// Clusters says, for the clusters the object has outputs in, whether
	// that cluster's agent applied them: every cluster up to 100 of them;
	// beyond that the 100 listed are the failed ones first, then the
	// pending ones, then applied ones, and ClusterCounts counts them all.
	// +listType=map
	// +listMapKey=cluster
	// +kubebuilder:validation:MaxItems=1024
	// +optional
	Clusters []ClusterApplyStatus `json:"clusters,omitempty"`
	// ClusterCounts counts every cluster the object has outputs in, by
	// state, including those Clusters leaves out.
	// +optional
	ClusterCounts *ClusterCounts `json:"clusterCounts,omitempty"`
}

// ClusterCounts counts clusters by the state of an object's outputs there.
type ClusterCounts struct {
	// Total is the number of clusters the object has outputs in.
	Total int32 `json:"total"`
	// Applied, Pending and Failed sum to Total.
	Applied int32 `json:"applied"`
	Pending int32 `json:"pending"`
	Failed  int32 `json:"failed"`
}

// ApplyState says whether a cluster's agent applied an object's outputs.
// +kubebuilder:validation:Enum=Pending;Applied;Failed
type ApplyState string

// Apply states.
const (
	// ApplyPending: the agent has not acknowledged the output version that
	// carries the object's current outputs.
	ApplyPending ApplyState = "Pending"
	// ApplyApplied: the agent applied (or found unchanged) every output.
	ApplyApplied ApplyState = "Applied"
	// ApplyFailed: some output was not applied; the errors say which.
	ApplyFailed ApplyState = "Failed"
)

// ClusterApplyStatus is the result of applying an object's outputs in one
// cluster.
type ClusterApplyStatus struct {
	// Cluster is the registered cluster's name.
	Cluster string `json:"cluster"`
	// State of the outputs there.
	State ApplyState `json:"state"`
	// Version is the output set version the agent last acknowledged.
	// +optional
	Version int64 `json:"version,omitempty"`
	// Errors name the outputs that were not applied, and why.
	// +optional
	Errors []string `json:"errors,omitempty"`
}

// TargetStatus is the verdict of a user object for one target (a Destination,
// a Mesh, a Workload) it applies to.
type TargetStatus struct {
	// Target names what the object applies to: a mesh or a Service as
	// `<cluster>/<namespace>/<name>`.
	Target string `json:"target"`
	// State of the object for this target.
	State ApprovalState `json:"state"`
	// Errors for this target.
	// +optional
	Errors []string `json:"errors,omitempty"`
}
