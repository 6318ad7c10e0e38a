package check

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"sort"
	"time"

	"github.com/relaymesh/relaymesh/api/crds"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/discovery"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/opsclient"
	"github.com/relaymesh/relaymesh/server/leader"
	"github.com/relaymesh/relaymesh/trust"
	"go.step.sm/crypto/pemutil"
	"istio.io/api/label"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"
	"sigs.k8s.io/yaml"
)

// Names the gatherers read.
const (
	// AgentConfigMap is where registration leaves the agent's settings.
	AgentConfigMap = "relaymesh-agent-config"
	// DefaultLeaseName is the agents' leader-election Lease.
	DefaultLeaseName = "relaymesh-agent"
	// WebhookConfiguration is the server's ValidatingWebhookConfiguration.
	WebhookConfiguration = "relaymesh-admission"
	// istioMeshConfigMap holds istiod's mesh config (the default revision's).
	istioMeshConfigMap = "istio"
	// istioRootCertKey is the key of istio-ca-root-cert.
	istioRootCertKey = "root-cert.pem"
)

// IstioCRDs are the Istio CRDs the agent applies outputs of
// (outputs.IstioKinds), as CRD names.
var IstioCRDs = istioCRDs()

func istioCRDs() []string {
	var names []string
	for _, r := range outputs.IstioResources() {
		names = append(names, r.GroupResource().String())
	}
	return names
}

// Config says what Gather reads.
type Config struct {
	// Mgmt is the management cluster; required.
	Mgmt *kubeclient.Clients
	// Namespace is the server's namespace there.
	Namespace string
	// Workloads are the workload clusters to check from their side.
	Workloads []WorkloadSource
	// AgentNamespace is the agents' namespace; default "relaymesh".
	AgentNamespace string
	// LeaseName is the agents' Lease; default DefaultLeaseName.
	LeaseName string
	// ServerAddress is the relay address (host:port); default: the one in
	// a workload cluster's relaymesh-agent-config. ServerName is the name
	// the certificate must carry; default the address's host.
	ServerAddress, ServerName string
	// Ops reads the server's metrics; nil: not read (a warning).
	Ops *opsclient.Client
	// Timeout bounds each network step; default 10s.
	Timeout time.Duration
	// RelayRootGrace is the server's relay root rotation grace (agent
	// certificate lifetime + 2 x --relay-issuer-check-interval): a phase
	// that waits on agents (AddingNewRoot, RemovingOldRoot) and lasts
	// longer, or a Switching that lasts twice as long, is stuck. Used only
	// when the rotation state does not record the grace of the server
	// that decided it (a server older than that record); default
	// DefaultRelayRootGrace.
	RelayRootGrace time.Duration
}

// DefaultRelayRootGrace is the server's grace with its default flags:
// --agent-cert-ttl 24h + 2 x --relay-issuer-check-interval 1m.
const DefaultRelayRootGrace = 24*time.Hour + 2*time.Minute

// WorkloadSource is a workload cluster's clients, or why there are none.
type WorkloadSource struct {
	Context string
	Clients *kubeclient.Clients
	Err     error
}

// Run gathers and evaluates at now.
func Run(ctx context.Context, cfg Config, now time.Time) (*Report, *Observations) {
	o := Gather(ctx, cfg)
	return NewReport(now, Evaluate(o, now)), o
}

// Gather reads everything Evaluate needs. It never fails as a whole:
// what it cannot read is recorded in the observations.
func Gather(ctx context.Context, cfg Config) *Observations {
	if cfg.AgentNamespace == "" {
		cfg.AgentNamespace = "relaymesh"
	}
	if cfg.LeaseName == "" {
		cfg.LeaseName = DefaultLeaseName
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.RelayRootGrace <= 0 {
		cfg.RelayRootGrace = DefaultRelayRootGrace
	}
	o := &Observations{Namespace: cfg.Namespace}
	o.CRDs = gatherCRDs(ctx, cfg)
	o.RelayRoots, o.RelayRootsErr = secretCerts(ctx, cfg.Mgmt, cfg.Namespace, ca.RootSecretName, "ca.crt")
	gatherSigningCA(ctx, cfg, o)
	o.RelayRotation, o.RelayRotationErr = gatherRelayRotation(ctx, cfg)
	for _, w := range cfg.Workloads {
		ow := gatherWorkload(ctx, cfg, w)
		if ow.Err == nil && w.Clients != nil {
			ow.Ambient = gatherAmbient(ctx, w.Clients)
		}
		o.Workloads = append(o.Workloads, ow)
	}
	o.Server = gatherServer(ctx, cfg, o)
	if cfg.Ops != nil {
		o.MetricsFrom = cfg.Ops.Where()
		if body, err := cfg.Ops.Get(ctx, "/metrics"); err != nil {
			o.MetricsErr = err
		} else {
			o.Metrics, o.MetricsErr = opsclient.ParseMetrics(body)
		}
	} else {
		o.MetricsFrom, o.MetricsErr = "nowhere", opsclient.ErrNoAddress
	}
	o.Dashboard = gatherDashboard(o.Metrics)
	o.Clusters, o.ClustersErr = listAs[multiclusterv1alpha1.KubernetesCluster](ctx, cfg.Mgmt.Dynamic, multiclusterv1alpha1.KubernetesClusters, cfg.Namespace)
	o.VirtualMeshes, o.VirtualMeshesErr = listAs[networkingv1alpha1.VirtualMesh](ctx, cfg.Mgmt.Dynamic, networkingv1alpha1.VirtualMeshes, "")
	o.Meshes = gatherMeshes(ctx, cfg, o)
	o.Discovered, o.DiscoveredErr = listAs[discoveryv1alpha1.Mesh](ctx, cfg.Mgmt.Dynamic, discoveryv1alpha1.Meshes, cfg.Namespace)
	o.FederatedTrustDomains, o.FederatedTrustDomainsErr = listAs[networkingv1alpha1.FederatedTrustDomain](ctx, cfg.Mgmt.Dynamic, networkingv1alpha1.FederatedTrustDomains, cfg.Namespace)
	o.Webhook = gatherWebhook(ctx, cfg)
	leases := cfg.Mgmt.Typed.CoordinationV1().Leases(cfg.Namespace)
	if o.ServerLease, o.ServerLeaseErr = leases.Get(ctx, leader.ServerLease, metav1.GetOptions{}); o.ServerLeaseErr != nil {
		o.ServerLease = nil
	}
	if list, err := leases.List(ctx, metav1.ListOptions{LabelSelector: leader.ReplicaLabel + "=true"}); err != nil {
		o.ReplicaLeasesErr = err
	} else {
		o.ReplicaLeases = list.Items
	}
	return o
}

// metricDashboardInfo is the server's account of how it serves the
// dashboard.
const metricDashboardInfo = "relaymesh_dashboard_info"

// gatherDashboard reads how the server serves its dashboard from its
// metrics (nil metrics: not served, as far as can be told).
func gatherDashboard(m opsclient.Metrics) Dashboard {
	tls, ok := m.Label(metricDashboardInfo, "tls")
	if !ok {
		return Dashboard{}
	}
	listener, _ := m.Label(metricDashboardInfo, "listener")
	return Dashboard{Served: true, TLS: tls, Listener: listener}
}

// gatherCRDs compares every embedded Relaymesh CRD with the cluster's.
func gatherCRDs(ctx context.Context, cfg Config) []CRD {
	want, err := embeddedCRDs()
	if err != nil {
		return []CRD{{Name: "relaymesh CRDs", Err: err}}
	}
	client, err := apiextensionsclient.NewForConfig(cfg.Mgmt.Config)
	if err != nil {
		return []CRD{{Name: "relaymesh CRDs", Err: err}}
	}
	var out []CRD
	for _, w := range want {
		ver := storageVersion(w)
		c := CRD{Name: w.Name, Version: ver.Name}
		have, err := client.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, w.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			out = append(out, c)
			continue
		case err != nil:
			c.Err = err
			out = append(out, c)
			continue
		}
		c.Found = true
		for _, cond := range have.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				c.Established = true
			}
		}
		for _, v := range have.Spec.Versions {
			if v.Name != ver.Name {
				continue
			}
			c.Served, c.Stored = v.Served, v.Storage
			c.SchemaDiffers = !equality.Semantic.DeepEqual(schemaOf(v), schemaOf(ver))
		}
		out = append(out, c)
	}
	return out
}

func embeddedCRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var out []*apiextensionsv1.CustomResourceDefinition
	err := fs.WalkDir(crds.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(crds.FS, path)
		if err != nil {
			return err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(b, crd); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, crd)
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, err
}

func storageVersion(crd *apiextensionsv1.CustomResourceDefinition) apiextensionsv1.CustomResourceDefinitionVersion {
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			return v
		}
	}
	return apiextensionsv1.CustomResourceDefinitionVersion{}
}

// schemaOf is a version's schema in a form that compares equal when the
// apiserver returns what was applied.
func schemaOf(v apiextensionsv1.CustomResourceDefinitionVersion) any {
	if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
		return nil
	}
	b, err := json.Marshal(v.Schema.OpenAPIV3Schema)
	if err != nil {
		return nil
	}
	var m any
	_ = json.Unmarshal(b, &m)
	return m
}

// secretCerts reads the certificates under key of a Secret. Only that key
// is parsed; nothing else of the Secret is kept.
func secretCerts(ctx context.Context, k *kubeclient.Clients, ns, name, key string) ([]*x509.Certificate, error) {
	s, err := k.Typed.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return certsOf(s, key)
}

// certsOf parses the certificates under key of s.
func certsOf(s *corev1.Secret, key string) ([]*x509.Certificate, error) {
	if len(s.Data[key]) == 0 {
		return nil, fmt.Errorf("secret %s/%s has no %s", s.Namespace, s.Name, key)
	}
	certs, err := pemutil.ParseCertificateBundle(s.Data[key])
	if err != nil {
		return nil, fmt.Errorf("secret %s/%s %s: %w", s.Namespace, s.Name, key, err)
	}
	return certs, nil
}

// gatherSigningCA reads the relay issuing CA and its generation from
// relay-tls-signing-secret (absent for a provided relay CA). Its key is
// never parsed or kept.
func gatherSigningCA(ctx context.Context, cfg Config, o *Observations) {
	s, err := cfg.Mgmt.Typed.CoreV1().Secrets(cfg.Namespace).Get(ctx, ca.SigningSecretName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		o.SigningCAErr = err
		return
	}
	if certs, err := certsOf(s, corev1.TLSCertKey); err != nil {
		o.SigningCAErr = err
	} else if len(certs) > 0 {
		o.SigningCA = certs[0]
	}
	o.IssuerGeneration, o.IssuerGenerationErr = ca.IssuerGeneration(s)
}

// gatherRelayRotation reads the relay root rotation from
// relay-root-tls-secret with the parsing relaymesh ca relay rotate status
// uses; nil, nil without the Secret. Only certificates are parsed, never
// a key.
func gatherRelayRotation(ctx context.Context, cfg Config) (*RelayRotation, error) {
	s, err := cfg.Mgmt.Typed.CoreV1().Secrets(cfg.Namespace).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	st, req, err := ca.DecodeRootRotation(s)
	if err != nil {
		return nil, err
	}
	r := &RelayRotation{State: st, Request: req, Grace: cfg.RelayRootGrace}
	if r.Current, r.Staged, err = ca.RootRotationRoots(s); err != nil {
		return nil, err
	}
	return r, nil
}

func gatherWorkload(ctx context.Context, cfg Config, src WorkloadSource) Workload {
	w := Workload{Context: src.Context, Err: src.Err}
	if src.Err != nil || src.Clients == nil {
		if w.Err == nil {
			w.Err = errors.New("no credentials")
		}
		return w
	}
	k := src.Clients
	ns := cfg.AgentNamespace
	cm, err := k.Typed.CoreV1().ConfigMaps(ns).Get(ctx, AgentConfigMap, metav1.GetOptions{})
	switch {
	case err != nil && !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err):
		// Not even the agent's namespace can be read: the cluster is out of reach.
		w.Err = err
		return w
	case err != nil:
		w.ConfigErr = fmt.Errorf("ConfigMap %s/%s: %w", ns, AgentConfigMap, err)
		return w
	}
	w.Cluster, w.ServerAddress = cm.Data["cluster"], cm.Data["serverAddress"]
	if w.Cluster == "" {
		w.ConfigErr = fmt.Errorf("ConfigMap %s/%s names no cluster", ns, AgentConfigMap)
		return w
	}
	if certs, err := secretCerts(ctx, k, ns, identity.ClientSecret, corev1.TLSCertKey); err != nil {
		w.ClientCertErr = err
	} else {
		w.ClientCert = certs[0]
	}
	w.RootCA, w.RootCAErr = secretCerts(ctx, k, ns, identity.RootSecret, identity.KeyCACert)
	w.Lease, w.LeaseErr = k.Typed.CoordinationV1().Leases(ns).Get(ctx, cfg.LeaseName, metav1.GetOptions{})
	if w.LeaseErr != nil {
		w.Lease = nil
	}
	if client, err := apiextensionsclient.NewForConfig(k.Config); err != nil {
		w.IstioCRDsErr = err
	} else {
		for _, name := range IstioCRDs {
			_, err := client.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				w.MissingIstioCRDs = append(w.MissingIstioCRDs, name)
			case err != nil:
				w.IstioCRDsErr = err
			}
		}
	}
	w.RemoteSecrets, w.RemoteSecretsErr = gatherRemoteSecrets(ctx, k)
	return w
}

// Istio's names for a remote secret (pkg/kube/multicluster and istioctl
// create-remote-secret): the label istiod selects them by in its system
// namespace, and the annotation naming the cluster the kubeconfig is for.
const (
	labelRemoteSecret       = "istio/multiCluster"
	annotationRemoteCluster = "networking.istio.io/cluster"
)

// gatherRemoteSecrets lists the cluster's Istio remote secrets in every
// namespace, as metadata only: the check never requests a Secret's data
// to say it is there, and keeps only the cluster annotation (a
// kubectl last-applied annotation may repeat the data; it is dropped).
func gatherRemoteSecrets(ctx context.Context, k *kubeclient.Clients) ([]RemoteSecret, error) {
	client, err := metadata.NewForConfig(k.Config)
	if err != nil {
		return nil, err
	}
	list, err := client.Resource(corev1.SchemeGroupVersion.WithResource("secrets")).Namespace("").
		List(ctx, metav1.ListOptions{LabelSelector: labelRemoteSecret + "=true"})
	if err != nil {
		return nil, fmt.Errorf("list Secrets labelled %s=true: %w", labelRemoteSecret, err)
	}
	out := make([]RemoteSecret, 0, len(list.Items))
	for _, s := range list.Items {
		out = append(out, RemoteSecret{Namespace: s.Namespace, Name: s.Name, Cluster: s.Annotations[annotationRemoteCluster]})
	}
	return out, nil
}

// Names the ambient check reads: Istio's labels and annotations, as
// istio.io/api names them.
var (
	labelDataplaneMode        = label.IoIstioDataplaneMode.Name
	labelUseWaypoint          = label.IoIstioUseWaypoint.Name
	labelUseWaypointNamespace = label.IoIstioUseWaypointNamespace.Name
	labelWaypointFor          = label.IoIstioWaypointFor.Name
	labelGatewayName          = label.IoK8sNetworkingGatewayGatewayName.Name
)

const (
	waypointClass = "istio-waypoint"
)

// gatherAmbient lists what the ambient pitfalls are judged from. A kind
// that is not served is nothing to check; any other failure is kept in
// Errs. Pods and Services are cut down to what the check reads as they
// are read.
func gatherAmbient(ctx context.Context, k *kubeclient.Clients) *Ambient {
	a := &Ambient{Namespaces: map[string]map[string]string{}}
	fail := func(what string, err error) {
		if !apierrors.IsNotFound(err) {
			a.Errs = append(a.Errs, fmt.Errorf("list %s: %w", what, err))
		}
	}
	if list, err := k.Typed.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); err != nil {
		fail("namespaces", err)
	} else {
		for _, ns := range list.Items {
			a.Namespaces[ns.Name] = ns.Labels
		}
	}
	if list, err := k.Typed.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); err != nil {
		fail("pods", err)
	} else {
		for i := range list.Items {
			p := &list.Items[i]
			a.Pods = append(a.Pods, Pod{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels,
				Sidecar: discovery.PodHasSidecar(p), Redirected: discovery.PodRedirected(p)})
		}
	}
	if list, err := k.Typed.CoreV1().Services("").List(ctx, metav1.ListOptions{}); err != nil {
		fail("services", err)
	} else {
		for _, s := range list.Items {
			a.Services = append(a.Services, Service{Namespace: s.Namespace, Name: s.Name, Labels: s.Labels, Headless: s.Spec.ClusterIP == corev1.ClusterIPNone})
		}
	}
	for _, l := range []struct {
		gvr schema.GroupVersionResource
		to  *[]unstructured.Unstructured
	}{
		{outputs.AuthorizationPolicies, &a.AuthorizationPolicies},
		{outputs.VirtualServices, &a.VirtualServices},
		{discovery.GatewayResource, &a.Waypoints},
		{outputs.HTTPRoutes, &a.HTTPRoutes},
		{outputs.GRPCRoutes, &a.GRPCRoutes},
		{outputs.TCPRoutes, &a.TCPRoutes},
	} {
		list, err := k.Dynamic.Resource(l.gvr).Namespace("").List(ctx, metav1.ListOptions{})
		if err != nil {
			fail(l.gvr.GroupResource().String(), err)
			continue
		}
		for _, u := range list.Items {
			if l.gvr == discovery.GatewayResource {
				if class, _, _ := unstructured.NestedString(u.Object, "spec", "gatewayClassName"); class != waypointClass {
					continue
				}
			}
			*l.to = append(*l.to, u)
		}
	}
	return a
}

// gatherServer dials the relay port and keeps what it presented.
func gatherServer(ctx context.Context, cfg Config, o *Observations) Server {
	s := Server{Address: cfg.ServerAddress, AddressFrom: "--server-address"}
	if s.Address == "" {
		for _, w := range o.Workloads {
			if w.ServerAddress != "" {
				s.Address, s.AddressFrom = w.ServerAddress, "the relaymesh-agent-config of "+w.Cluster
				break
			}
		}
	}
	if s.Address == "" {
		return s
	}
	host, _, err := net.SplitHostPort(s.Address)
	if err != nil {
		s.DialErr = err
		return s
	}
	name := cfg.ServerName
	if name == "" {
		name = host
	}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: cfg.Timeout}, Config: &tls.Config{
		// Verified below against the relay roots, so the chain is kept
		// even when it does not verify.
		InsecureSkipVerify: true, //nolint:gosec // verified by hand right after the handshake
		ServerName:         name,
		NextProtos:         []string{"h2"},
		MinVersion:         tls.VersionTLS12,
	}}
	dctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	conn, err := d.DialContext(dctx, "tcp", s.Address)
	if err != nil {
		s.DialErr = err
		return s
	}
	tc, ok := conn.(*tls.Conn)
	if !ok {
		_ = conn.Close()
		s.DialErr = fmt.Errorf("dialled %s without TLS", s.Address)
		return s
	}
	s.Chain = tc.ConnectionState().PeerCertificates
	_ = conn.Close()
	if len(s.Chain) == 0 {
		return s
	}
	if len(o.RelayRoots) == 0 {
		s.VerifyErr = errors.New("the relay roots could not be read")
		return s
	}
	inter := x509.NewCertPool()
	for _, c := range s.Chain[1:] {
		inter.AddCert(c)
	}
	_, s.VerifyErr = s.Chain[0].Verify(x509.VerifyOptions{DNSName: name, Roots: pool(o.RelayRoots), Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	return s
}

// gatherMeshes reads the CA of every mesh of a shared-trust VirtualMesh
// from its workload cluster: cacerts (public parts) and istiod's root.
func gatherMeshes(ctx context.Context, cfg Config, o *Observations) []MeshCA {
	clusters := map[string]*kubeclient.Clients{}
	for i, w := range o.Workloads {
		if w.Err == nil && cfg.Workloads[i].Clients != nil {
			name := w.Cluster
			if name == "" {
				name = w.Context
			}
			clusters[name] = cfg.Workloads[i].Clients
		}
	}
	var out []MeshCA
	for _, vm := range o.VirtualMeshes {
		if vm.Spec.MTLS == nil || vm.Spec.MTLS.Shared == nil {
			continue
		}
		for _, ref := range vm.Spec.Meshes {
			m := MeshCA{VirtualMesh: vm.Namespace + "/" + vm.Name, Cluster: ref.ClusterName, Namespace: ref.Namespace}
			k := clusters[ref.ClusterName]
			if k == nil {
				out = append(out, m)
				continue
			}
			m.Reachable = true
			s, err := k.Typed.CoreV1().Secrets(ref.Namespace).Get(ctx, trust.SecretName, metav1.GetOptions{})
			if err != nil {
				m.CACertsErr = err
			} else if ca, err := trust.ParseMeshCA(ref.ClusterName, ref.Namespace, map[string][]byte{
				trust.KeyCACert: s.Data[trust.KeyCACert], trust.KeyChain: s.Data[trust.KeyChain], trust.KeyRootCert: s.Data[trust.KeyRootCert]}); err != nil {
				m.CACertsErr = err
			} else {
				m.Intermediate, m.Roots = ca.Intermediate, ca.Roots
			}
			if cm, err := k.Typed.CoreV1().ConfigMaps(ref.Namespace).Get(ctx, istioMeshConfigMap, metav1.GetOptions{}); err == nil {
				m.TrustDomain = discovery.MeshTrustDomain(cm.Data[discovery.MeshConfigKey])
			} else if apierrors.IsNotFound(err) {
				m.TrustDomain = discovery.MeshTrustDomain("")
			}
			if cm, err := k.Typed.CoreV1().ConfigMaps(ref.Namespace).Get(ctx, trust.RootCertConfigMap, metav1.GetOptions{}); err != nil {
				m.IstiodRootsErr = err
			} else if m.IstiodRoots, err = pemutil.ParseCertificateBundle([]byte(cm.Data[istioRootCertKey])); err != nil {
				m.IstiodRootsErr = fmt.Errorf("%s/%s %s: %w", ref.Namespace, trust.RootCertConfigMap, istioRootCertKey, err)
			}
			out = append(out, m)
		}
	}
	return out
}

// probeName names the dry-run object the webhook is asked about.
const probeName = "relaymesh-check-probe"

func gatherWebhook(ctx context.Context, cfg Config) Webhook {
	var w Webhook
	hook, err := cfg.Mgmt.Typed.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, WebhookConfiguration, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		w.NotFound = true
		return w
	case err != nil:
		w.ConfigErr = err
		return w
	}
	w.Config = hook
	// A server-side dry run goes through admission like a real create, so
	// the apiserver calls the webhook; nothing is stored.
	ref := map[string]any{"name": probeName, "namespace": probeName, "clusterName": probeName}
	probe := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": networkingv1alpha1.GroupVersion.String(), "kind": "AccessPolicy",
		"metadata": map[string]any{"name": probeName, "namespace": cfg.Namespace},
		"spec": map[string]any{
			"sourceSelector":      []any{map[string]any{"kubeServiceAccountRefs": map[string]any{"serviceAccounts": []any{ref}}}},
			"destinationSelector": []any{map[string]any{"kubeServiceRefs": map[string]any{"services": []any{ref}}}},
		},
	}}
	dctx, cancel := context.WithTimeout(ctx, cfg.Timeout+35*time.Second)
	defer cancel()
	_, err = cfg.Mgmt.Dynamic.Resource(networkingv1alpha1.AccessPolicies).Namespace(cfg.Namespace).
		Create(dctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: "relaymesh-check"})
	w.DryRunRan, w.DryRunErr = true, err
	if apierrors.IsAlreadyExists(err) {
		w.DryRunErr = nil
	}
	return w
}

// listAs lists a resource (namespace "": every namespace) as typed objects.
func listAs[T any](ctx context.Context, client dynamic.Interface, gvr schema.GroupVersionResource, namespace string) ([]T, error) {
	list, err := client.Resource(gvr).Namespace(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", gvr.Resource, err)
	}
	out := make([]T, 0, len(list.Items))
	for i := range list.Items {
		var t T
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(list.Items[i].Object, &t); err != nil {
			return nil, fmt.Errorf("%s %s/%s: %w", gvr.Resource, list.Items[i].GetNamespace(), list.Items[i].GetName(), err)
		}
		out = append(out, t)
	}
	return out, nil
}
