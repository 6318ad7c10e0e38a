package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// FederatedTrustDomain is a foreign SPIFFE trust domain whose bundle
// Relaymesh fetches from its bundle endpoint (SPIFFE Federation spec) and
// keeps current: a SPIRE server, another Relaymesh, any SPIFFE peer. Only
// objects in the server's own namespace are fetched; the Lease holder
// fetches and writes the status, every replica reads the accepted bundle
// from it (docs/spiffe-federation.md).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rmftd,categories=relaymesh
// +kubebuilder:printcolumn:name="Trust domain",type=string,JSONPath=`.spec.trustDomain`
// +kubebuilder:printcolumn:name="Profile",type=string,JSONPath=`.spec.profile`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Sequence",type=integer,JSONPath=`.status.sequence`
// +kubebuilder:printcolumn:name="Last fetch",type=date,JSONPath=`.status.lastFetch`
type FederatedTrustDomain struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   FederatedTrustDomainSpec   `json:"spec"`
	Status FederatedTrustDomainStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// FederatedTrustDomainList is a list of FederatedTrustDomains.
type FederatedTrustDomainList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []FederatedTrustDomain `json:"items"`
}

// FederatedTrustDomainSpec names a foreign trust domain and where its
// bundle is published.
//
// +kubebuilder:validation:XValidation:rule="self.profile != 'https_spiffe' || (has(self.endpointSPIFFEID) && has(self.bootstrapBundle))",message="the https_spiffe profile needs endpointSPIFFEID and bootstrapBundle"
// +kubebuilder:validation:XValidation:rule="self.profile != 'https_web' || (!has(self.endpointSPIFFEID) && !has(self.bootstrapBundle))",message="endpointSPIFFEID and bootstrapBundle are for the https_spiffe profile only"
// +kubebuilder:validation:XValidation:rule="!has(self.endpointSPIFFEID) || self.endpointSPIFFEID.startsWith('spiffe://' + self.trustDomain + '/')",message="endpointSPIFFEID must be a SPIFFE ID with a path in trustDomain"
// +kubebuilder:validation:XValidation:rule="self.profile != 'https_spiffe' || !has(self.webRootsPEM)",message="webRootsPEM is for the https_web profile only"
type FederatedTrustDomainSpec struct {
	// TrustDomain is the peer's trust domain name, e.g. spire.example
	// (never one a VirtualMesh of this Relaymesh publishes or a cluster
	// is granted: such an object is Invalid).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9._]*[a-z0-9])?$')",message="must be a SPIFFE trust domain name: lowercase letters, digits, '-', '.' and '_'"
	TrustDomain string `json:"trustDomain"`
	// BundleEndpointURL is the peer's bundle endpoint, https only.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.startsWith('https://')",message="must be an https:// URL"
	// +kubebuilder:validation:XValidation:rule="!self.substring(8).split('/')[0].contains('@')",message="must not carry user information: a bundle endpoint takes no client authentication"
	BundleEndpointURL string `json:"bundleEndpointURL"`
	// Profile is how the endpoint authenticates itself: https_web (a
	// certificate from webRootsPEM, or the system roots) or https_spiffe
	// (an X509-SVID for endpointSPIFFEID, verified with the bundle last
	// accepted, bootstrapBundle first).
	// +kubebuilder:validation:Enum=https_web;https_spiffe
	Profile string `json:"profile"`
	// EndpointSPIFFEID is the endpoint server's SPIFFE ID (https_spiffe).
	// +kubebuilder:validation:MaxLength=2048
	// +optional
	EndpointSPIFFEID string `json:"endpointSPIFFEID,omitempty"`
	// BootstrapBundle is the peer's roots, PEM, obtained out of band
	// (https_spiffe; `spire-server bundle show`): what authenticates the
	// endpoint until its first bundle is accepted.
	// +kubebuilder:validation:MaxLength=65536
	// +optional
	BootstrapBundle string `json:"bootstrapBundle,omitempty"`
	// WebRootsPEM are the roots the https_web endpoint's certificate
	// must chain to, PEM; empty: the server's system roots.
	// +kubebuilder:validation:MaxLength=65536
	// +optional
	WebRootsPEM string `json:"webRootsPEM,omitempty"`
}

// FederatedTrustDomainState is the verdict on a FederatedTrustDomain.
// +kubebuilder:validation:Enum=Pending;Current;Stale;Invalid
type FederatedTrustDomainState string

// The states of a FederatedTrustDomain.
const (
	// FederatedPending: no bundle accepted yet.
	FederatedPending FederatedTrustDomainState = "Pending"
	// FederatedCurrent: the last fetch was accepted.
	FederatedCurrent FederatedTrustDomainState = "Current"
	// FederatedStale: the last fetch was refused; the last accepted
	// bundle is kept (status.error says why).
	FederatedStale FederatedTrustDomainState = "Stale"
	// FederatedInvalid: the spec cannot be used (status.error says why);
	// nothing is fetched and no bundle is kept.
	FederatedInvalid FederatedTrustDomainState = "Invalid"
)

// FederatedTrustDomainStatus is what the Lease holder last fetched.
type FederatedTrustDomainStatus struct {
	// ObservedGeneration is the metadata.generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// State is the verdict.
	// +optional
	State FederatedTrustDomainState `json:"state,omitempty"`
	// TrustDomain is the trust domain the bundle below belongs to: a spec
	// edit that keeps it (a new URL, new web roots) keeps the bundle and
	// its sequence; one that changes it starts afresh.
	// +kubebuilder:validation:MaxLength=255
	// +optional
	TrustDomain string `json:"trustDomain,omitempty"`
	// Error is why the last fetch was refused (Stale) or the spec is
	// unusable (Invalid). It never quotes what the endpoint answered (the
	// server's log and audit record do).
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Error string `json:"error,omitempty"`
	// LastFetch is when the endpoint was last asked.
	// +optional
	LastFetch *metav1.Time `json:"lastFetch,omitempty"`
	// LastAccepted is when a fetch was last accepted (the same bundle
	// again included): how current the bundle is.
	// +optional
	LastAccepted *metav1.Time `json:"lastAccepted,omitempty"`
	// LastChanged is when the accepted bundle last changed (new roots or
	// a new sequence).
	// +optional
	LastChanged *metav1.Time `json:"lastChanged,omitempty"`
	// Sequence is the accepted bundle's spiffe_sequence.
	// +optional
	Sequence uint64 `json:"sequence,omitempty"`
	// RefreshHint is the accepted bundle's spiffe_refresh_hint, seconds.
	// +optional
	RefreshHint int64 `json:"refreshHint,omitempty"`
	// Roots are the accepted bundle's X.509 authorities.
	// +kubebuilder:validation:MaxItems=8
	// +optional
	Roots []FederatedRoot `json:"roots,omitempty"`
	// BundlePEM is the accepted bundle's X.509 authorities, PEM: what the
	// replicas read (and, for https_spiffe, what authenticates the next
	// fetch).
	// +kubebuilder:validation:MaxLength=65536
	// +optional
	BundlePEM string `json:"bundlePEM,omitempty"`
}

// FederatedRoot describes one root of an accepted foreign bundle.
type FederatedRoot struct {
	// Fingerprint is the SHA-256 of the root's DER, hex.
	// +kubebuilder:validation:MaxLength=64
	Fingerprint string `json:"fingerprint"`
	// Subject is the root's subject.
	// +kubebuilder:validation:MaxLength=1024
	Subject string `json:"subject"`
	// NotAfter is when the root expires.
	NotAfter metav1.Time `json:"notAfter"`
}
