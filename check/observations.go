package check

import (
	"crypto/x509"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/internal/opsclient"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Observations are what Gather saw. Each part carries the error that kept
// it from being seen; Evaluate turns every such error into a finding.
type Observations struct {
	// Namespace is the server's namespace in the management cluster.
	Namespace string
	// CRDs are the Relaymesh CRDs this binary expects, as found.
	CRDs []CRD
	// RelayRoots are the certificates of relay-root-tls-secret (ca.crt);
	// SigningCA the issuing CA of relay-tls-signing-secret (tls.crt), nil
	// for a provided relay CA.
	RelayRoots    []*x509.Certificate
	RelayRootsErr error
	SigningCA     *x509.Certificate
	SigningCAErr  error
	// IssuerGeneration is the issuing CA's generation as
	// relay-tls-signing-secret records it (ca.IssuerGeneration); 0 when
	// unknown (no such Secret, or IssuerGenerationErr).
	IssuerGeneration    int
	IssuerGenerationErr error
	// RelayRotation is the relay root rotation relay-root-tls-secret
	// records; nil with RelayRotationErr when it does not decode, nil
	// without an error when there is no such Secret (RelayRootsErr says
	// so). Its agents are the relay-mode Clusters'.
	RelayRotation    *RelayRotation
	RelayRotationErr error
	// Server is the relay port as dialled.
	Server Server
	// Metrics are the server's metrics (nil with MetricsErr when they
	// could not be read); MetricsFrom says where from.
	Metrics     opsclient.Metrics
	MetricsErr  error
	MetricsFrom string
	// Clusters are the KubernetesClusters of Namespace.
	Clusters    []multiclusterv1alpha1.KubernetesCluster
	ClustersErr error
	// Workloads are the workload clusters the run had credentials for.
	Workloads []Workload
	// VirtualMeshes are all VirtualMeshes of the management cluster.
	VirtualMeshes    []networkingv1alpha1.VirtualMesh
	VirtualMeshesErr error
	// Meshes are the CAs of the meshes of shared-trust VirtualMeshes, as
	// found in their workload clusters.
	Meshes []MeshCA
	// Discovered are the Mesh objects the server discovered (in
	// Namespace): each with the trust domain its agent reports.
	Discovered    []discoveryv1alpha1.Mesh
	DiscoveredErr error
	// FederatedTrustDomains are the FederatedTrustDomains of Namespace:
	// the foreign trust domains the server's Lease holder imports. Nil
	// with FederatedTrustDomainsErr when they could not be listed (NotFound:
	// the CRD is not installed; Forbidden: this run may not list them).
	FederatedTrustDomains    []networkingv1alpha1.FederatedTrustDomain
	FederatedTrustDomainsErr error
	// Webhook is the admission webhook.
	Webhook Webhook
	// ServerLease is the server replicas' leader Lease (leader.ServerLease);
	// ReplicaLeases are each replica's own Lease.
	ServerLease      *coordinationv1.Lease
	ServerLeaseErr   error
	ReplicaLeases    []coordinationv1.Lease
	ReplicaLeasesErr error
	// Dashboard is how the server says it serves its dashboard (read from
	// Metrics; zero when they could not be read).
	Dashboard Dashboard
}

// RelayRotation is the relay root rotation as relay-root-tls-secret
// records it (ca.DecodeRootRotation, ca.RootRotationRoots).
type RelayRotation struct {
	State   ca.RootRotationState
	Request ca.RootRequest
	// Current is the root in ca.crt, Staged the staged one (nil: none).
	Current, Staged *x509.Certificate
	// Grace is how long the rotation's phases may take before check calls
	// it stuck (Config.RelayRootGrace).
	Grace time.Duration
}

// Dashboard is the server's web dashboard, as its metric
// relaymesh_dashboard_info reports it.
type Dashboard struct {
	// Served is false when the server reports no dashboard.
	Served bool
	// TLS is what it is served with: relay-ca, files, or none (plain
	// HTTP); Listener is loopback or network, the address it bound.
	TLS, Listener string
}

// CRD is one expected CustomResourceDefinition.
type CRD struct {
	Name    string
	Version string
	Found   bool
	Err     error
	// Established is the CRD's Established condition.
	Established bool
	// Served and Stored say whether Version is served and is the storage
	// version.
	Served, Stored bool
	// SchemaDiffers is true when the installed schema of Version is not
	// this binary's.
	SchemaDiffers bool
}

// Server is the relay server as seen from here.
type Server struct {
	// Address dialled, and where it came from ("--server-address", "the
	// agent config of cluster-1"); empty Address: not known.
	Address, AddressFrom string
	// Chain is what the server presented; VerifyErr why it does not verify
	// against the relay roots for the address's name.
	Chain     []*x509.Certificate
	DialErr   error
	VerifyErr error
}

// Workload is one workload cluster and its agent, as read with the run's
// credentials for it.
type Workload struct {
	// Context is the kubeconfig context.
	Context string
	// Cluster is the name the agent's relaymesh-agent-config gives it
	// (empty with ConfigErr when it has none).
	Cluster       string
	ServerAddress string
	ConfigErr     error
	// ClientCert is the agent's certificate (relay-client-tls-secret
	// tls.crt); nil with ClientCertErr.
	ClientCert    *x509.Certificate
	ClientCertErr error
	// RootCA is what the agent pins (relay-root-tls-secret ca.crt).
	RootCA    []*x509.Certificate
	RootCAErr error
	// Lease is the agents' leader-election Lease; nil with LeaseErr.
	Lease    *coordinationv1.Lease
	LeaseErr error
	// MissingIstioCRDs are Istio CRDs the agent applies that are absent;
	// IstioCRDsErr when they could not be listed.
	MissingIstioCRDs []string
	IstioCRDsErr     error
	// Ambient is what the ambient pitfalls are judged from; nil when the
	// cluster could not be reached.
	Ambient *Ambient
	// RemoteSecrets are the cluster's Istio remote secrets (Secrets
	// labelled istio/multiCluster=true), read as metadata only: their
	// data is never requested (only the cluster annotation is kept). RemoteSecretsErr when they could not
	// be listed (nil RemoteSecrets then means unknown, not none).
	RemoteSecrets    []RemoteSecret
	RemoteSecretsErr error
	// Err is set when the cluster could not be reached at all.
	Err error
}

// MeshCA is one mesh's plugged-in CA, for a mesh of a shared-trust
// VirtualMesh.
type MeshCA struct {
	// VirtualMesh is NAMESPACE/NAME of the VirtualMesh naming the mesh.
	VirtualMesh string
	// Cluster and Namespace of the mesh's istiod.
	Cluster, Namespace string
	// Reachable is false when the run has no credentials for Cluster.
	Reachable bool
	// Intermediate, Chain and Roots are the public parts of cacerts; nil
	// with CACertsErr.
	Intermediate *x509.Certificate
	Roots        []*x509.Certificate
	CACertsErr   error
	// TrustDomain is the mesh's, from istiod's mesh config.
	TrustDomain string
	// IstiodRoots are the roots istiod publishes (istio-ca-root-cert
	// root-cert.pem in Namespace); nil with IstiodRootsErr.
	IstiodRoots    []*x509.Certificate
	IstiodRootsErr error
}

// Webhook is the admission webhook as seen from here.
type Webhook struct {
	// Config is the ValidatingWebhookConfiguration; nil with ConfigErr or
	// when it does not exist (NotFound).
	Config    *admissionregistrationv1.ValidatingWebhookConfiguration
	NotFound  bool
	ConfigErr error
	// DryRunErr is the apiserver's answer to a server-side dry-run create
	// the webhook is asked about: nil (admitted), a denial (reachable) or a
	// failure to call it.
	DryRunErr error
	DryRunRan bool
}

// Ambient is what a workload cluster holds that the ambient pitfalls are
// judged from (evalAmbient): the cluster's own objects, not what discovery
// reported. A kind the cluster does not serve (Gateway API not installed;
// an Istio CRD missing, which evalWorkload reports) is left empty: nothing
// of it to check.
type Ambient struct {
	// Namespaces are the namespaces' labels, by name.
	Namespaces map[string]map[string]string
	Pods       []Pod
	Services   []Service
	// The Istio and Gateway API objects as read: evalAmbient reads them
	// field by field and never trusts their shape. Gateways are only those
	// of class istio-waypoint.
	AuthorizationPolicies []unstructured.Unstructured
	VirtualServices       []unstructured.Unstructured
	Waypoints             []unstructured.Unstructured
	HTTPRoutes            []unstructured.Unstructured
	GRPCRoutes            []unstructured.Unstructured
	TCPRoutes             []unstructured.Unstructured
	// Errs are the lists that failed for another reason than the kind not
	// being served, each naming its resource.
	Errs []error
}

// Pod is what the ambient check needs of a pod.
type Pod struct {
	Namespace, Name string
	Labels          map[string]string
	// Sidecar: the pod has an istio-proxy sidecar (injected), so ztunnel
	// never captures it.
	Sidecar bool
	// Redirected: istio-cni says it captured the pod
	// (ambient.istio.io/redirection: enabled).
	Redirected bool
}

// RemoteSecret is an Istio remote secret as its metadata says: istiod in
// the secret's namespace (its system namespace) reads the kubeconfig it
// holds and watches that cluster's API server with it.
type RemoteSecret struct {
	Namespace, Name string
	// Cluster is the cluster the kubeconfig is for
	// (networking.istio.io/cluster, as istioctl create-remote-secret
	// writes it); empty when the secret does not say.
	Cluster string
}

// Service is what the ambient check needs of a Service.
type Service struct {
	Namespace, Name string
	Labels          map[string]string
	// Headless: spec.clusterIP is None.
	Headless bool
}
