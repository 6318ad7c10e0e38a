package v1alpha1

import (
	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KubernetesCluster registers a workload cluster. Its name is the cluster's
// identity: it appears in the agent's SPIFFE ID and in discovered names, so
// it must be a DNS label.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rmkc,categories=relaymesh
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name must be a DNS label (at most 63 characters of a-z, 0-9 and '-')"
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.mode`
// +kubebuilder:printcolumn:name="Connected",type=boolean,JSONPath=`.status.connected`
// +kubebuilder:printcolumn:name="Last Event",type=date,JSONPath=`.status.lastSeen`,description="when the server last recorded an event of the agent's session; an idle connected session records none"
// +kubebuilder:printcolumn:name="Cert Expires",type=string,JSONPath=`.status.agentCertificate.notAfter`,description="when the agent's client certificate expires (RFC 3339; relaymesh cluster list shows it as in 23h)"
// +kubebuilder:printcolumn:name="Replica",type=string,JSONPath=`.status.replica`,priority=1,description="the server replica holding the agent's session"
type KubernetesCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   KubernetesClusterSpec   `json:"spec"`
	Status KubernetesClusterStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// KubernetesClusterList is a list of KubernetesClusters.
type KubernetesClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []KubernetesCluster `json:"items"`
}

// RegistrationMode is how the server reaches a cluster.
// +kubebuilder:validation:Enum=relay;kubeconfig
type RegistrationMode string

// Registration modes.
const (
	// ModeRelay: an agent in the cluster dials out to the server; the server
	// holds no credential for the cluster. The default and the secure choice.
	ModeRelay RegistrationMode = "relay"
	// ModeKubeconfig: the server holds a kubeconfig for the cluster and runs
	// the agent logic itself. Weaker: a compromised server owns the cluster.
	ModeKubeconfig RegistrationMode = "kubeconfig"
)

// KubernetesClusterSpec is how a cluster is registered.
// +kubebuilder:validation:XValidation:rule="self.mode != 'kubeconfig' || has(self.kubeconfigSecretRef)",message="kubeconfigSecretRef is required in kubeconfig mode"
// +kubebuilder:validation:XValidation:rule="self.mode != 'relay' || !has(self.kubeconfigSecretRef)",message="kubeconfigSecretRef must not be set in relay mode"
type KubernetesClusterSpec struct {
	// Mode is relay (an agent dials out) or kubeconfig (the server dials in).
	// +kubebuilder:default=relay
	Mode RegistrationMode `json:"mode"`
	// ClusterDomain is the cluster's DNS suffix.
	// +kubebuilder:default=cluster.local
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="must be a DNS name such as cluster.local: lowercase letters, digits and '-' between the dots"
	// +optional
	ClusterDomain string `json:"clusterDomain,omitempty"`
	// KubeconfigSecretRef names the secret with the cluster's kubeconfig
	// (key `kubeconfig`), in kubeconfig mode only.
	// +optional
	KubeconfigSecretRef *common.ObjectRef `json:"kubeconfigSecretRef,omitempty"`
	// TrustDomains are the trust domains this cluster's meshes may use
	// (the grant). A mesh reporting any other gets no intermediate and
	// makes every VirtualMesh naming it Invalid. Empty: the default grant,
	// `<cluster name>.local` (DefaultTrustDomain). A trust domain granted
	// to two clusters is usable by neither unless both mark it shared.
	// Only whoever may write KubernetesClusters in the management cluster
	// (an administrator) changes it; what an agent reports never does.
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=32
	// +optional
	TrustDomains []TrustDomainGrant `json:"trustDomains,omitempty"`
}

// TrustDomainGrant is one trust domain a cluster's meshes may use.
type TrustDomainGrant struct {
	// Name is the trust domain: what a mesh may report, 1 to 255
	// lower-case letters, digits, '.', '-' and '_' (relay.CheckTrustDomain).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[-._a-z0-9]+$`
	Name string `json:"name"`
	// Shared lets other clusters hold this trust domain too, each of which
	// must mark it shared as well. WEAKER: the meshes of every cluster
	// holding it can sign each other's identities. Meant for fleets that
	// kept Istio's default cluster.local everywhere.
	// +optional
	Shared bool `json:"shared,omitempty"`
}

// DefaultTrustDomainSuffix ends the trust domain a cluster is granted when
// its KubernetesCluster names none.
const DefaultTrustDomainSuffix = ".local"

// DefaultTrustDomain is the trust domain cluster is granted when its
// KubernetesCluster names none: `<cluster>.local`.
func DefaultTrustDomain(cluster string) string { return cluster + DefaultTrustDomainSuffix }

// Grant is the trust domains the cluster's meshes may use: spec.trustDomains,
// or the default grant when it is empty.
func (kc *KubernetesCluster) Grant() []TrustDomainGrant {
	if len(kc.Spec.TrustDomains) > 0 {
		return kc.Spec.TrustDomains
	}
	return []TrustDomainGrant{{Name: DefaultTrustDomain(kc.Name)}}
}

// KubernetesClusterStatus is what the server knows of a cluster.
type KubernetesClusterStatus struct {
	common.Status `json:",inline"`
	// Connected is true while the cluster's agent holds an open stream.
	// +optional
	Connected bool `json:"connected,omitempty"`
	// LastSeen is when the server last recorded an event of the agent's
	// session (it connected, renewed, sent a snapshot or an ack, or
	// disconnected). An idle session writes nothing: while Connected, the
	// session itself, held by Replica, is the evidence (relaymesh cluster
	// list shows "now" for it).
	// +optional
	LastSeen *metav1.Time `json:"lastSeen,omitempty"`
	// AgentCertificate is the agent's current client certificate.
	// +optional
	AgentCertificate *AgentCertificate `json:"agentCertificate,omitempty"`
	// AgentVersion is the version the agent reported.
	// +optional
	AgentVersion string `json:"agentVersion,omitempty"`
	// AgentClockOffset is the agent's clock minus the server's when the
	// agent's session opened (positive: the agent is ahead), from the time
	// the agent sent in its Hello; it includes the one-way network delay.
	// +optional
	AgentClockOffset *metav1.Duration `json:"agentClockOffset,omitempty"`
	// Replica is the server replica holding the agent's session (written by
	// that replica; with several replicas, only it marks the cluster
	// disconnected).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Replica string `json:"replica,omitempty"`
	// AppliedOutputs is what the agent acked last: the output version it
	// applied, the objects it could not apply and its mesh CA Secrets. The
	// replica holding the session writes it at once when the results
	// change; an ack that only moves the version on is written with the
	// next heartbeat (lastSeen): once the acked version has not moved for
	// 15 s, at least 30 s after the last write, in the cluster's slot of
	// the next 15 s. So the version here may lag by up to 45 s after the
	// last of a series of edits, and by up to 5 min 15 s while edits keep
	// coming.
	// The replicas record every ack's version within a quarter second in
	// the ack ledger (ConfigMaps relaymesh-acks-NN, several replicas),
	// where the replica holding the Lease reads every cluster's (a
	// rotation step ends when every mesh's agent applied it).
	// +optional
	AppliedOutputs *AppliedOutputs `json:"appliedOutputs,omitempty"`
	// Discovered summarizes the agent's last accepted snapshot (written by
	// the replica that accepted it).
	// +optional
	Discovered *DiscoverySummary `json:"discovered,omitempty"`
	// TrustDomains says, for every trust domain the cluster is granted or
	// its meshes report, whether its meshes may use it (written by the
	// server replica holding the Lease).
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	// +optional
	TrustDomains []TrustDomainStatus `json:"trustDomains,omitempty"`
}

// TrustDomainState is the verdict on one trust domain of a cluster.
// +kubebuilder:validation:Enum=Authorized;Conflict;NotGranted
type TrustDomainState string

// Trust domain verdicts.
const (
	// TrustDomainAuthorized: granted, and held by no other cluster (or
	// marked shared by every cluster holding it). Its meshes get
	// intermediates.
	TrustDomainAuthorized TrustDomainState = "Authorized"
	// TrustDomainConflict: granted, but another cluster holds it too and
	// not every holder marks it shared. No mesh of any holder may use it.
	TrustDomainConflict TrustDomainState = "Conflict"
	// TrustDomainNotGranted: a mesh of the cluster reports it, outside the
	// cluster's grant. That mesh gets no intermediate.
	TrustDomainNotGranted TrustDomainState = "NotGranted"
)

// TrustDomainStatus is the server's verdict on one trust domain of a
// cluster.
type TrustDomainStatus struct {
	// +kubebuilder:validation:MaxLength=255
	Name  string           `json:"name"`
	State TrustDomainState `json:"state"`
	// Meshes are the cluster's meshes reporting this trust domain, as
	// namespace/name of their control plane, at most 16.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=507
	// +optional
	Meshes []string `json:"meshes,omitempty"`
	// Message says why, and what an administrator can do.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Message string `json:"message,omitempty"`
}

// DiscoverySummary counts what a cluster's last accepted discovery snapshot
// holds, and says where its Workloads are kept. It changes only when a
// count does (not with every endpoint), so it costs a status write only
// then.
type DiscoverySummary struct {
	Meshes       int32 `json:"meshes"`
	Workloads    int32 `json:"workloads"`
	Destinations int32 `json:"destinations"`
	// ServiceAccounts is how many distinct service accounts (namespace and
	// name) the workloads run as.
	ServiceAccounts int32 `json:"serviceAccounts"`
	// WorkloadsIn is where the Workloads are: apiserver (Workload objects
	// in the server's namespace) or redis (the server replicas' snapshot
	// store: read them through the server, e.g. the dashboard).
	// +kubebuilder:validation:Enum=apiserver;redis
	WorkloadsIn string `json:"workloadsIn"`
}

// Where a cluster's Workloads are kept (DiscoverySummary.WorkloadsIn).
const (
	WorkloadsInAPIServer = "apiserver"
	WorkloadsInRedis     = "redis"
)

// AppliedOutputs is an agent's last ack of an output set.
type AppliedOutputs struct {
	// Version of the output set applied, in decimal (versions exceed what
	// JSON numbers keep exactly).
	// +kubebuilder:validation:MaxLength=20
	// +kubebuilder:validation:Pattern=`^[0-9]+$`
	Version string `json:"version"`
	// Results are the failed objects and the mesh CA Secrets, at most 256.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	Results []AppliedResult `json:"results,omitempty"`
}

// AppliedResult is the outcome of one object of an output set.
type AppliedResult struct {
	// +optional
	// +kubebuilder:validation:MaxLength=253
	APIVersion string `json:"apiVersion,omitempty"`
	// +kubebuilder:validation:MaxLength=253
	Kind string `json:"kind"`
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Namespace string `json:"namespace,omitempty"`
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// applied, unchanged, pruned, conflict or error.
	// +kubebuilder:validation:MaxLength=16
	Outcome string `json:"outcome"`
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Error string `json:"error,omitempty"`
	// CrossIssuer is, for a cacerts Secret, the fingerprint of the second
	// root whose signature of the intermediate the agent holds (a
	// CrossSigned root rotation's steps 1 and 2).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	CrossIssuer string `json:"crossIssuer,omitempty"`
}

// AgentCertificate describes an agent's client certificate (never its key).
type AgentCertificate struct {
	// Serial in hex.
	Serial string `json:"serial"`
	// SPIFFEID the server assigned.
	SPIFFEID string `json:"spiffeID"`
	// NotAfter is the expiry.
	NotAfter metav1.Time `json:"notAfter"`
}
