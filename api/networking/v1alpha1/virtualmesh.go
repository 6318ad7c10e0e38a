package v1alpha1

import (
	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// VirtualMesh federates Istio meshes in several clusters: shared trust from
// one root CA, service federation under a global hostname suffix, and an
// optional deny-by-default access policy.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rmvm,categories=relaymesh
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Rotation",type=string,JSONPath=`.status.rotation.phase`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type VirtualMesh struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   VirtualMeshSpec   `json:"spec"`
	Status VirtualMeshStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// VirtualMeshList is a list of VirtualMeshes.
type VirtualMeshList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMesh `json:"items"`
}

// VirtualMeshSpec is what a VirtualMesh asks for.
type VirtualMeshSpec struct {
	// Meshes to federate, each named by its control plane: the istiod
	// Deployment's clusterName, namespace and name (e.g. cluster-1,
	// istio-system, istiod). A mesh may belong to at most one VirtualMesh.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=256
	Meshes []common.ClusterObjectRef `json:"meshes"`

	// MTLS configures identity and trust between the meshes.
	// +optional
	MTLS *MTLSConfig `json:"mtls,omitempty"`

	// Federation decides which services are reachable across meshes, and how.
	// +optional
	Federation *Federation `json:"federation,omitempty"`

	// GlobalAccessPolicy: Enabled denies all traffic in every mesh unless an
	// AccessPolicy allows it; Disabled allows all; MeshDefault keeps each mesh's
	// own setting.
	// +kubebuilder:default=MeshDefault
	// +optional
	GlobalAccessPolicy GlobalAccessPolicy `json:"globalAccessPolicy,omitempty"`
}

// GlobalAccessPolicy is the VirtualMesh-wide access default.
// +kubebuilder:validation:Enum=MeshDefault;Enabled;Disabled
type GlobalAccessPolicy string

// Global access policy values.
const (
	GlobalAccessMeshDefault GlobalAccessPolicy = "MeshDefault"
	GlobalAccessEnabled     GlobalAccessPolicy = "Enabled"
	GlobalAccessDisabled    GlobalAccessPolicy = "Disabled"
)

// MTLSConfig configures trust between the meshes of a VirtualMesh.
type MTLSConfig struct {
	// Shared gives every mesh an intermediate CA signed by one root, so
	// workloads in different meshes trust each other.
	// +optional
	Shared *SharedTrust `json:"shared,omitempty"`

	// RotationStrategy says how a change of root is rolled out. MultiRoot
	// distributes old and new roots side by side so no handshake fails;
	// CrossSigned keeps one root in every bundle and has each intermediate
	// signed by both roots while they change places, so a data plane that
	// trusts a single root (ambient's ztunnel) never fails a handshake
	// either; None replaces the root at once and may break connections. A
	// rotation keeps the strategy it started with.
	// +kubebuilder:default=MultiRoot
	// +optional
	RotationStrategy RotationStrategy `json:"rotationStrategy,omitempty"`

	// RotationVerification: Manual waits at every rotation phase for
	// `relaymesh ca rotate continue`; None proceeds once every agent acked.
	// +kubebuilder:default=None
	// +optional
	RotationVerification RotationVerification `json:"rotationVerification,omitempty"`

	// AutoRestartPods restarts istiod and then the workloads of each mesh after
	// its CA changed, once the new root bundle reached their namespace. It
	// restarts every workload; leave it off in production.
	// +optional
	AutoRestartPods bool `json:"autoRestartPods,omitempty"`

	// StrictMTLS adds a STRICT PeerAuthentication to every mesh.
	// +optional
	StrictMTLS bool `json:"strictMTLS,omitempty"`

	// TrustDomains: Distinct (the default) requires every member mesh to
	// have a trust domain of its own, so an identity names exactly one mesh
	// and each mesh's intermediate CA can sign only its own identities.
	// WEAKER Shared lets several meshes claim one trust domain (Istio's
	// default cluster.local everywhere): each of their CAs can then sign the
	// identities of the others, and policies cannot tell their workloads
	// apart.
	// +kubebuilder:default=Distinct
	// +optional
	TrustDomains TrustDomainPolicy `json:"trustDomains,omitempty"`

	// FederatedTrustDomains are foreign SPIFFE trust domains whose
	// workloads the member meshes accept as peers: each must be imported
	// by a FederatedTrustDomain in the server's namespace (state Current
	// or Stale). Each foreign root reaches the meshes' root bundle as a
	// cross-certificate the VirtualMesh root signs, name-constrained to
	// that trust domain, so a foreign root can never vouch for the meshes'
	// own identities; status.sharedTrust.federation says what was
	// delivered. Needs shared trust, a root Relaymesh signs with itself
	// (generated, a Secret or PKCS#11; cfssl and step-ca sign only
	// certificate requests) and no ambient member (ztunnel trusts one
	// root only). The cross-certificate is one CA level below the
	// VirtualMesh root: a foreign CA that signs its SVIDs directly (SPIRE's
	// default) verifies everywhere; a foreign chain with intermediates of
	// its own (another Relaymesh's meshes) only where the cross-certificate
	// is taken as an anchor (Go, proxyless gRPC), not in Envoy.
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=255
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9._]*[a-z0-9])?$`
	// +listType=set
	// +optional
	FederatedTrustDomains []string `json:"federatedTrustDomains,omitempty"`
}

// TrustDomainPolicy says whether member meshes may share a trust domain.
// +kubebuilder:validation:Enum=Distinct;Shared
type TrustDomainPolicy string

// Trust domain policies.
const (
	TrustDomainsDistinct TrustDomainPolicy = "Distinct"
	TrustDomainsShared   TrustDomainPolicy = "Shared"
)

// RotationStrategy is how a root change is rolled out.
// +kubebuilder:validation:Enum=MultiRoot;CrossSigned;None
type RotationStrategy string

// Rotation strategies.
const (
	RotationMultiRoot   RotationStrategy = "MultiRoot"
	RotationCrossSigned RotationStrategy = "CrossSigned"
	RotationNone        RotationStrategy = "None"
)

// RotationVerification is how each rotation phase is confirmed.
// +kubebuilder:validation:Enum=None;Manual
type RotationVerification string

// Rotation verification methods.
const (
	VerificationNone   RotationVerification = "None"
	VerificationManual RotationVerification = "Manual"
)

// SharedTrust is one root CA for every mesh of the VirtualMesh.
type SharedTrust struct {
	// RootCA is where the shared root lives.
	RootCA RootCA `json:"rootCA"`
	// IntermediateOptions shape each mesh's intermediate CA.
	// +optional
	IntermediateOptions *CertOptions `json:"intermediateOptions,omitempty"`
}

// RootCA says where the shared root CA lives; exactly one field is set.
// +kubebuilder:validation:XValidation:rule="(has(self.generated) ? 1 : 0) + (has(self.secret) ? 1 : 0) + (has(self.external) ? 1 : 0) + (has(self.pkcs11) ? 1 : 0) == 1",message="exactly one of generated, secret, external or pkcs11 must be set"
type RootCA struct {
	// Generated: the server creates a self-signed root and keeps it in a
	// secret of the management cluster.
	// +optional
	Generated *CertOptions `json:"generated,omitempty"`
	// Secret: a user-provided CA (a root, or an intermediate of a longer
	// chain) in a secret of the management cluster, keys `tls.crt`, `tls.key`
	// and, for intermediates, `ca.crt` (the chain up to the root).
	// +optional
	Secret *common.ObjectRef `json:"secret,omitempty"`
	// External: an external CA service signs the intermediates.
	// +optional
	External *ExternalCA `json:"external,omitempty"`
	// PKCS11: the root key lives in a hardware security module.
	// +optional
	PKCS11 *PKCS11CA `json:"pkcs11,omitempty"`
}

// ExternalCA is a CA service that signs intermediate CSRs.
type ExternalCA struct {
	// Provider is the kind of CA service.
	// +kubebuilder:validation:Enum=cfssl;stepca
	Provider string `json:"provider"`
	// URL of the CA service; must be https unless the provider is cfssl on
	// loopback.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	URL string `json:"url"`
	// ConfigRef names a secret with the provider's credentials and CA bundle.
	ConfigRef common.ObjectRef `json:"configRef"`
}

// PKCS11CA is a root whose private key lives in an HSM.
type PKCS11CA struct {
	// ModulePath is the PKCS#11 module on the server's file system.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	ModulePath string `json:"modulePath"`
	// TokenLabel names the token (slot) that holds the key.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=32
	TokenLabel string `json:"tokenLabel"`
	// KeyLabel names the private key object on the token.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	KeyLabel string `json:"keyLabel"`
	// PINSecretRef names a secret whose key `pin` holds the user PIN.
	PINSecretRef common.ObjectRef `json:"pinSecretRef"`
	// CertificateSecretRef names a secret whose key `tls.crt` holds the root
	// certificate matching the HSM key.
	CertificateSecretRef common.ObjectRef `json:"certificateSecretRef"`
}

// CertOptions shape a generated certificate.
type CertOptions struct {
	// TTL of the certificate, a Go duration. Defaults: 87600h for roots,
	// 8760h for intermediates.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$')",message="must be a Go duration such as 30s, 1m30s or 8760h (units h, m, s, ms, us, ns)"
	// +optional
	TTL *metav1.Duration `json:"ttl,omitempty"`
	// KeyAlgorithm of the generated key.
	// +kubebuilder:default=ECDSAP256
	// +optional
	KeyAlgorithm KeyAlgorithm `json:"keyAlgorithm,omitempty"`
	// OrgName is the certificate subject's organization.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	OrgName string `json:"orgName,omitempty"`
	// RenewAtPercent of the lifetime at which the certificate is renewed.
	// +kubebuilder:validation:Minimum=10
	// +kubebuilder:validation:Maximum=90
	// +kubebuilder:default=66
	// +optional
	RenewAtPercent int32 `json:"renewAtPercent,omitempty"`
}

// KeyAlgorithm is a key type and size.
// +kubebuilder:validation:Enum=ECDSAP256;ECDSAP384;RSA2048;RSA3072;RSA4096
type KeyAlgorithm string

// Key algorithms.
const (
	KeyECDSAP256 KeyAlgorithm = "ECDSAP256"
	KeyECDSAP384 KeyAlgorithm = "ECDSAP384"
	KeyRSA2048   KeyAlgorithm = "RSA2048"
	KeyRSA3072   KeyAlgorithm = "RSA3072"
	KeyRSA4096   KeyAlgorithm = "RSA4096"
)

// Federation decides which Destinations are reachable from other meshes.
type Federation struct {
	// Selectors choose which Destinations federate to which meshes. Omitted:
	// nothing federates. A selector with no fields: everything federates
	// everywhere.
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Selectors []FederationSelector `json:"selectors,omitempty"`
	// HostnameSuffix of federated hostnames, `<svc>.<ns>.svc.<cluster>.<suffix>`.
	// +kubebuilder:default=global
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')",message="must be a DNS subdomain: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
	// +optional
	HostnameSuffix string `json:"hostnameSuffix,omitempty"`
	// EastWestGatewaySelectors choose the gateways that carry cross-cluster
	// traffic; omitted: Services labelled `istio: eastwestgateway`.
	// +kubebuilder:validation:MaxItems=64
	// +optional
	EastWestGatewaySelectors []GatewaySelector `json:"eastWestGatewaySelectors,omitempty"`
	// FlatNetwork routes straight to pod IPs instead of through east-west
	// gateways; only for networks where pods of all clusters can reach each
	// other.
	// +optional
	FlatNetwork bool `json:"flatNetwork,omitempty"`
}

// FederationSelector federates the selected Destinations to the listed meshes.
type FederationSelector struct {
	// DestinationSelectors choose Destinations; omitted: all of them.
	// +kubebuilder:validation:MaxItems=64
	// +optional
	DestinationSelectors []common.DestinationSelector `json:"destinationSelectors,omitempty"`
	// Meshes receive the Destinations (clusterName, namespace and name of
	// their istiod, as in spec.meshes); omitted: every mesh of the
	// VirtualMesh.
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Meshes []common.ClusterObjectRef `json:"meshes,omitempty"`
}

// GatewaySelector selects east-west gateway Services and their TLS port.
type GatewaySelector struct {
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	DestinationSelectors []common.DestinationSelector `json:"destinationSelectors"`
	// PortName of the gateway's TLS port.
	// +kubebuilder:default=tls
	// +kubebuilder:validation:MaxLength=63
	// +optional
	PortName string `json:"portName,omitempty"`
}

// VirtualMeshStatus is what Relaymesh made of a VirtualMesh.
type VirtualMeshStatus struct {
	common.Status `json:",inline"`
	// Meshes is the verdict per member mesh.
	// +optional
	Meshes []common.TargetStatus `json:"meshes,omitempty"`
	// Rotation is the progress of a root rotation, if one ran.
	// +optional
	Rotation *RotationStatus `json:"rotation,omitempty"`
	// SharedTrust is the root of spec.mtls.shared and the intermediate each
	// mesh was last issued (written by the server's trust controller).
	// +optional
	SharedTrust *SharedTrustStatus `json:"sharedTrust,omitempty"`
}

// SharedTrustStatus describes a VirtualMesh's shared root and intermediates.
type SharedTrustStatus struct {
	// RootFingerprint is the SHA-256 of the root's DER, hex.
	// +optional
	RootFingerprint string `json:"rootFingerprint,omitempty"`
	// RootSubject is the root's subject.
	// +optional
	RootSubject string `json:"rootSubject,omitempty"`
	// RootNotAfter is when the root expires.
	// +optional
	RootNotAfter *metav1.Time `json:"rootNotAfter,omitempty"`
	// Message says why the meshes' CAs are held as they are, when the
	// server cannot use the root.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Message string `json:"message,omitempty"`
	// Root is where the root in force lives, so a change of
	// spec.mtls.shared.rootCA can be recognised as a rotation from it.
	// +optional
	Root *RootSource `json:"root,omitempty"`
	// Meshes is the intermediate last issued to each mesh.
	// +listType=map
	// +listMapKey=mesh
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Meshes []MeshCAStatus `json:"meshes,omitempty"`
	// Federation is what the meshes' root bundle carries of each foreign
	// trust domain spec.mtls.federatedTrustDomains names: a
	// cross-certificate per foreign root, or why there is none.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Federation []FederatedTrustStatus `json:"federation,omitempty"`
}

// FederatedTrustStatus is one foreign root delivered to the meshes, or a
// foreign trust domain that could not be (Message says why).
type FederatedTrustStatus struct {
	// TrustDomain is the foreign trust domain.
	// +kubebuilder:validation:MaxLength=255
	TrustDomain string `json:"trustDomain"`
	// ForeignRootFingerprint is the SHA-256 of the foreign root's DER, hex.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	ForeignRootFingerprint string `json:"foreignRootFingerprint,omitempty"`
	// IssuerFingerprint is the VirtualMesh root that signed the
	// cross-certificate.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	IssuerFingerprint string `json:"issuerFingerprint,omitempty"`
	// NotAfter is when the cross-certificate expires (never after the
	// foreign root, nor the VirtualMesh root).
	// +optional
	NotAfter *metav1.Time `json:"notAfter,omitempty"`
	// CertificatePEM is the cross-certificate: the foreign root's subject
	// and key, permitted URIs of TrustDomain only.
	// +kubebuilder:validation:MaxLength=16384
	// +optional
	CertificatePEM string `json:"certificatePEM,omitempty"`
	// Message says why nothing of this trust domain is delivered.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Message string `json:"message,omitempty"`
}

// MeshCAStatus is the intermediate CA last issued to one mesh.
type MeshCAStatus struct {
	// Mesh is the discovered Mesh's name.
	Mesh string `json:"mesh"`
	// Cluster the mesh runs in.
	Cluster string `json:"cluster"`
	// TrustDomain is the only trust domain the intermediate may sign
	// identities of (its name constraints).
	// +optional
	TrustDomain string `json:"trustDomain,omitempty"`
	// Serial of the intermediate, hex.
	Serial string `json:"serial"`
	// NotBefore and NotAfter bound its validity.
	NotBefore metav1.Time `json:"notBefore"`
	NotAfter  metav1.Time `json:"notAfter"`
	// Issuer is the fingerprint of the root it chains to.
	Issuer string `json:"issuer"`
}

// RotationPhase is a step of a MultiRoot root rotation.
// +kubebuilder:validation:Enum=NotRotating;AddingNewRoot;PropagatingNewIntermediate;DeletingOldRoot;Finished;RollingBack;RolledBack;Failed
type RotationPhase string

// Rotation phases, in order.
const (
	PhaseNotRotating                RotationPhase = "NotRotating"
	PhaseAddingNewRoot              RotationPhase = "AddingNewRoot"
	PhasePropagatingNewIntermediate RotationPhase = "PropagatingNewIntermediate"
	PhaseDeletingOldRoot            RotationPhase = "DeletingOldRoot"
	PhaseFinished                   RotationPhase = "Finished"
	PhaseRollingBack                RotationPhase = "RollingBack"
	PhaseRolledBack                 RotationPhase = "RolledBack"
	PhaseFailed                     RotationPhase = "Failed"
)

// RotationStatus records where a root rotation is, so a restarted server
// resumes it.
type RotationStatus struct {
	// Phase is the current step.
	Phase RotationPhase `json:"phase"`
	// OldRootFingerprint and NewRootFingerprint are SHA-256 fingerprints of
	// the roots being replaced and introduced.
	// +optional
	OldRootFingerprint string `json:"oldRootFingerprint,omitempty"`
	// +optional
	NewRootFingerprint string `json:"newRootFingerprint,omitempty"`
	// LastTransitionTime is when Phase last changed.
	// +optional
	LastTransitionTime *metav1.Time `json:"lastTransitionTime,omitempty"`
	// AwaitingContinue is true while a Manual verification waits for
	// `relaymesh ca rotate continue`.
	// +optional
	AwaitingContinue bool `json:"awaitingContinue,omitempty"`
	// Message explains the current phase.
	// +optional
	Message string `json:"message,omitempty"`
	// Step is what the meshes are asked to hold now. MultiRoot: 0 the old
	// root only; 1 both roots, intermediates from the old; 2 both roots,
	// intermediates from the new; 3 the new root only. CrossSigned: 0 the
	// old root, intermediates from it; 1 the old root, intermediates signed
	// by both (the old root's signature first); 2 the new root,
	// intermediates signed by both (the new root's first); 3 the new root,
	// intermediates from it. Forward phases raise it, RollingBack lowers it
	// one acked step at a time.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=3
	// +optional
	Step int32 `json:"step,omitempty"`
	// From and To are where the old and the new root live.
	// +optional
	From *RootSource `json:"from,omitempty"`
	// +optional
	To *RootSource `json:"to,omitempty"`
	// OldRoots and NewRoots are the PEM certificates of both roots, so the
	// bundles of every step (and a rollback) can be published even when
	// one of them cannot be loaded.
	// +kubebuilder:validation:MaxLength=65536
	// +optional
	OldRoots string `json:"oldRoots,omitempty"`
	// +kubebuilder:validation:MaxLength=65536
	// +optional
	NewRoots string `json:"newRoots,omitempty"`
	// Strategy is the rotationStrategy the rotation started with (empty:
	// MultiRoot, a rotation recorded before strategies were recorded).
	// +kubebuilder:validation:Enum=MultiRoot;CrossSigned;None
	// +optional
	Strategy RotationStrategy `json:"strategy,omitempty"`
	// PendingMeshes are the meshes whose agents have not yet acked Step.
	// +kubebuilder:validation:MaxItems=256
	// +optional
	PendingMeshes []string `json:"pendingMeshes,omitempty"`
}

// RootSource is where a root lives: the spec.mtls.shared.rootCA it came
// from; a generated root also by the Secret that holds it.
type RootSource struct {
	RootCA `json:",inline"`
	// GeneratedSecret names the Secret (in the server's namespace) of a
	// generated root.
	// +optional
	GeneratedSecret string `json:"generatedSecret,omitempty"`
}

// Annotations on a VirtualMesh that steer a root rotation (`relaymesh ca
// rotate`). Who may annotate the VirtualMesh may steer its rotation.
const (
	// AnnotationRootGeneration: changing it makes a generated root anew
	// (a new key), which starts a rotation to it.
	AnnotationRootGeneration = "relaymesh.io/root-generation"
	// AnnotationRotationContinue, "<phase>/<new root fingerprint>", lets a
	// Manual rotation leave that phase.
	AnnotationRotationContinue = "relaymesh.io/rotation-continue"
	// AnnotationRotationRollback, "<new root fingerprint>", rolls the
	// rotation to that root back.
	AnnotationRotationRollback = "relaymesh.io/rotation-rollback"
	// AnnotationRotationRetry, "<new root fingerprint>", rotates again to
	// a root a rotation was rolled back from.
	AnnotationRotationRetry = "relaymesh.io/rotation-retry"
	// AnnotationVirtualMeshes, on a Secret a root names (a provided root,
	// an HSM PIN or certificate, a CA service's credentials): the
	// VirtualMeshes that may use it, comma-separated namespace/name, or
	// "*" for all. A Secret without it serves no VirtualMesh.
	AnnotationVirtualMeshes = "relaymesh.io/virtualmeshes"
)
