package check

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/internal/opsclient"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var now = time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)

func TestExpiry(t *testing.T) {
	day := 24 * time.Hour
	for _, tc := range []struct {
		name string
		l    Lifetime
		want Severity
		msg  string
	}{
		{"root with a year", Lifetime{What: "root", NotBefore: now.Add(-day), NotAfter: now.Add(365 * day)}, OK, "root expires in"},
		{"root with 29 days", Lifetime{What: "root", NotBefore: now.Add(-day), NotAfter: now.Add(29 * day)}, Warning, "root expires in 29d"},
		{"root with 20 days of a 21-day life", Lifetime{What: "root", NotBefore: now.Add(-day), NotAfter: now.Add(20 * day)}, Warning, "expires in 20d"},
		{"root with 6 days", Lifetime{What: "root", NotAfter: now.Add(6 * day)}, Error, "expires in 6d"},
		{"expired", Lifetime{What: "root", NotAfter: now.Add(-time.Minute)}, Error, "root expired 60s ago"},
		{"not yet valid", Lifetime{What: "cert", NotBefore: now.Add(time.Hour), NotAfter: now.Add(2 * time.Hour)}, Warning, "not valid until"},
		{"fresh 24h agent cert", Lifetime{What: "agent", NotBefore: now.Add(-time.Hour), NotAfter: now.Add(23 * time.Hour), RenewAt: 2.0 / 3}, OK, "agent expires in 23h"},
		{"24h agent cert at its renewal point", Lifetime{What: "agent", NotBefore: now.Add(-16 * time.Hour), NotAfter: now.Add(8 * time.Hour), RenewAt: 2.0 / 3}, OK, ""},
		{"24h agent cert renewal overdue", Lifetime{What: "agent", NotBefore: now.Add(-19 * time.Hour), NotAfter: now.Add(5 * time.Hour), RenewAt: 2.0 / 3}, Warning, "renewal is overdue"},
		{"24h agent cert nearly gone", Lifetime{What: "agent", NotBefore: now.Add(-22 * time.Hour), NotAfter: now.Add(2 * time.Hour), RenewAt: 2.0 / 3}, Error, "renewed long ago"},
		{"year intermediate renewed at 90%", Lifetime{What: "i", NotBefore: now.Add(-335 * day), NotAfter: now.Add(30 * day), RenewAt: 0.9}, OK, ""},
		{"year intermediate renewed at 90%, overdue", Lifetime{What: "i", NotBefore: now.Add(-340 * day), NotAfter: now.Add(25 * day), RenewAt: 0.9}, Warning, "renewal is overdue"},
		{"year intermediate with 20 days at 66%", Lifetime{What: "i", NotBefore: now.Add(-345 * day), NotAfter: now.Add(20 * day), RenewAt: 0.66}, Warning, ""},
		{"year intermediate with 5 days", Lifetime{What: "i", NotBefore: now.Add(-360 * day), NotAfter: now.Add(5 * day), RenewAt: 0.66}, Error, ""},
		{"renewed, lifetime unknown", Lifetime{What: "agent", NotAfter: now.Add(time.Hour), RenewAt: 2.0 / 3}, OK, "expires in 60m"},
		{"renewed, lifetime unknown, expired", Lifetime{What: "agent", NotAfter: now.Add(-time.Hour), RenewAt: 2.0 / 3}, Error, "expired"},
		{"foreign root with 20 days", Lifetime{What: "peer root", NotAfter: now.Add(20 * day), Foreign: true}, OK, "expires in 20d"},
		{"foreign root with 6 days", Lifetime{What: "peer root", NotAfter: now.Add(6 * day), Foreign: true}, Warning, "peer root expires in 6d"},
		{"foreign root expired", Lifetime{What: "peer root", NotAfter: now.Add(-time.Hour), Foreign: true}, Error, "peer root expired 60m ago"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sev, msg := Expiry(tc.l, now)
			assert.Equal(t, tc.want, sev, msg)
			assert.Contains(t, msg, tc.msg)
		})
	}
}

// newCA makes a self-signed CA, or one signed by parent.
func newCA(t *testing.T, cn string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, notAfter time.Time, mod func(*x509.Certificate)) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn}, NotBefore: now.Add(-24 * time.Hour), NotAfter: notAfter,
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	if mod != nil {
		mod(tmpl)
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	require.NoError(t, err)
	c, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return c, key
}

func find(rs []Result, area, subject string) []Result {
	var out []Result
	for _, r := range rs {
		if r.Area == area && (subject == "" || r.Subject == subject) {
			out = append(out, r)
		}
	}
	return out
}

// worst is the worst severity among rs and its messages.
func worst(rs []Result) (Severity, string) {
	s := OK
	var msgs []string
	for _, r := range rs {
		s = max(s, r.Severity)
		msgs = append(msgs, r.Message)
	}
	return s, strings.Join(msgs, " | ")
}

func TestEvaluateCRDs(t *testing.T) {
	for _, tc := range []struct {
		crd  CRD
		want Severity
		msg  string
	}{
		{CRD{Name: "a", Version: "v1alpha1", Found: true, Established: true, Served: true, Stored: true}, OK, "installed"},
		{CRD{Name: "a", Version: "v1alpha1"}, Error, "not installed"},
		{CRD{Name: "a", Version: "v1alpha1", Found: true, Established: true}, Error, "not served and stored"},
		{CRD{Name: "a", Version: "v1alpha1", Found: true, Served: true, Stored: true}, Error, "not established"},
		{CRD{Name: "a", Version: "v1alpha1", Found: true, Established: true, Served: true, Stored: true, SchemaDiffers: true}, Warning, "schema is not this relaymesh version's"},
		{CRD{Name: "a", Err: errors.New("forbidden")}, Error, "forbidden"},
	} {
		s, msg := worst(evalCRDs(&Observations{CRDs: []CRD{tc.crd}}))
		assert.Equal(t, tc.want, s, msg)
		assert.Contains(t, msg, tc.msg)
	}
}

func TestEvaluateServerAndRelayCA(t *testing.T) {
	root, rootKey := newCA(t, "relay root", nil, nil, now.Add(10*365*24*time.Hour), nil)
	short, _ := newCA(t, "short root", nil, nil, now.Add(3*24*time.Hour), nil)
	issuing, issuingKey := newCA(t, "relay issuing", root, rootKey, now.Add(20*24*time.Hour), nil)
	leaf, _ := newCA(t, "server", issuing, issuingKey, now.Add(20*24*time.Hour), func(c *x509.Certificate) { c.IsCA = false })
	for _, tc := range []struct {
		name string
		o    Observations
		area string
		want Severity
		msg  string
	}{
		{"roots fine", Observations{RelayRoots: []*x509.Certificate{root}}, AreaRelayCA, OK, "relay root relay root expires in"},
		{"root expiring", Observations{RelayRoots: []*x509.Certificate{short}}, AreaRelayCA, Error, "expires in 3d"},
		{"issuing CA in 20 days", Observations{RelayRoots: []*x509.Certificate{root}, SigningCA: issuing}, AreaRelayCA, Warning, "relay issuing CA relay issuing expires in 20d"},
		{"issuing CA from another root", Observations{RelayRoots: []*x509.Certificate{short}, SigningCA: issuing}, AreaRelayCA, Error, "does not chain to the relay roots"},
		{"issuing CA past its renewal point", Observations{RelayRoots: []*x509.Certificate{root}, Metrics: metrics(t, "relaymesh_relay_issuer_renewal_due 1\nrelaymesh_relay_issuer_generation 1\n")},
			AreaRelayCA, Warning, "relay issuing CA (generation 1) is past its renewal point and not renewed"},
		{"issuing CA renewed", Observations{RelayRoots: []*x509.Certificate{root}, Metrics: metrics(t, "relaymesh_relay_issuer_renewal_due 0\nrelaymesh_relay_issuer_generation 3\n")},
			AreaRelayCA, OK, "generation 3) is not due"},
		{"no roots", Observations{RelayRootsErr: apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, "relay-root-tls-secret")}, AreaRelayCA, Error, "has the server started once"},
		{"address unknown", Observations{}, AreaServer, Warning, "relay address is unknown"},
		{"unreachable", Observations{Server: Server{Address: "h:1", AddressFrom: "x", DialErr: errors.New("connection refused")}}, AreaServer, Error, "unreachable"},
		{"foreign certificate", Observations{Server: Server{Address: "h:1", VerifyErr: errors.New("unknown authority")}}, AreaServer, Error, "does not verify against the relay root"},
		{"healthy", Observations{Server: Server{Address: "h:1", AddressFrom: "x", Chain: []*x509.Certificate{leaf}}}, AreaServer, OK, "reachable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, msg := worst(find(Evaluate(&tc.o, now), tc.area, ""))
			assert.Equal(t, tc.want, s, msg)
			assert.Contains(t, msg, tc.msg)
		})
	}
}

func metrics(t *testing.T, text string) opsclient.Metrics {
	t.Helper()
	m, err := opsclient.ParseMetrics([]byte(text))
	require.NoError(t, err)
	return m
}

func TestEvaluateAgents(t *testing.T) {
	seen := metav1.NewTime(now.Add(-time.Hour))
	offset := func(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }
	kc := func(name string, connected bool, off *metav1.Duration) multiclusterv1alpha1.KubernetesCluster {
		return multiclusterv1alpha1.KubernetesCluster{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: multiclusterv1alpha1.KubernetesClusterSpec{Mode: multiclusterv1alpha1.ModeRelay},
			Status: multiclusterv1alpha1.KubernetesClusterStatus{Connected: connected, LastSeen: &seen, AgentClockOffset: off, AgentVersion: "v1"}}
	}
	oneSession := metrics(t, "relaymesh_relay_connected_agents 1\n")
	for _, tc := range []struct {
		name    string
		o       Observations
		area    string
		subject string
		want    Severity
		msg     string
	}{
		{"connected", Observations{Clusters: []multiclusterv1alpha1.KubernetesCluster{kc("c1", true, offset(time.Second))}, Metrics: oneSession}, AreaAgents, "c1", OK, "agent connected (version v1)"},
		{"not connected", Observations{Clusters: []multiclusterv1alpha1.KubernetesCluster{kc("c1", false, nil)}, Metrics: oneSession}, AreaAgents, "c1", Error, "agent not connected (last seen 60m ago)"},
		{"an extra session", Observations{Clusters: []multiclusterv1alpha1.KubernetesCluster{kc("c1", true, nil)}, Metrics: metrics(t, "relaymesh_relay_connected_agents 2\n")}, AreaAgents, "sessions", Error, "holds 2 agent sessions but only 1 registered clusters are connected"},
		{"sessions not counted", Observations{Clusters: []multiclusterv1alpha1.KubernetesCluster{kc("c1", true, nil)}, MetricsErr: errors.New("refused"), MetricsFrom: "x"}, AreaAgents, "sessions", Warning, "sessions not counted"},
		{"clock fine", Observations{Clusters: []multiclusterv1alpha1.KubernetesCluster{kc("c1", true, offset(-800*time.Millisecond))}}, AreaClock, "c1", OK, "within 5s"},
		{"clock ahead", Observations{Clusters: []multiclusterv1alpha1.KubernetesCluster{kc("c1", true, offset(7*time.Second))}}, AreaClock, "c1", Warning, "7s ahead of the server's"},
		{"clock far behind", Observations{Clusters: []multiclusterv1alpha1.KubernetesCluster{kc("c1", true, offset(-3*time.Minute))}}, AreaClock, "c1", Error, "3m0s behind the server's"},
		{"clock not reported", Observations{Clusters: []multiclusterv1alpha1.KubernetesCluster{kc("c1", true, nil)}}, AreaClock, "c1", Warning, "has not reported its clock"},
		{"kubeconfig mode", Observations{Clusters: []multiclusterv1alpha1.KubernetesCluster{{ObjectMeta: metav1.ObjectMeta{Name: "k"}, Spec: multiclusterv1alpha1.KubernetesClusterSpec{Mode: multiclusterv1alpha1.ModeKubeconfig}}}}, AreaAgents, "k", Warning, "WEAKER"},
		{"agent names an unregistered cluster", Observations{Workloads: []Workload{{Context: "ctx", Cluster: "ghost"}}}, AreaAgents, "ghost", Error, `names cluster "ghost", which is not registered`},
		{"workload unreachable", Observations{Workloads: []Workload{{Context: "ctx", Err: errors.New("dial tcp: refused")}}}, AreaAgents, "context ctx", Error, "unreachable"},
		{"no agent config", Observations{Workloads: []Workload{{Context: "ctx", ConfigErr: errors.New("not found")}}}, AreaAgents, "context ctx", Error, "relaymesh cluster register"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, msg := worst(find(Evaluate(&tc.o, now), tc.area, tc.subject))
			assert.Equal(t, tc.want, s, msg)
			assert.Contains(t, msg, tc.msg)
		})
	}
}

func TestEvaluateWorkload(t *testing.T) {
	root, rootKey := newCA(t, "relay root", nil, nil, now.Add(365*24*time.Hour), nil)
	other, otherKey := newCA(t, "other root", nil, nil, now.Add(365*24*time.Hour), nil)
	u, _ := url.Parse("spiffe://relaymesh.local/cluster/c1/agent")
	leaf := func(notBefore, notAfter time.Time) *x509.Certificate {
		c, _ := newCA(t, "agent", root, rootKey, notAfter, func(c *x509.Certificate) {
			c.IsCA, c.NotBefore, c.URIs, c.ExtKeyUsage, c.SerialNumber = false, notBefore, []*url.URL{u}, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, big.NewInt(0xabc)
		})
		return c
	}
	holder := "agent-0"
	lease := func(renewed time.Time) *coordinationv1.Lease {
		secs := int32(15)
		r := metav1.NewMicroTime(renewed)
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "relaymesh-agent"}, Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &r, LeaseDurationSeconds: &secs}}
	}
	registered := []multiclusterv1alpha1.KubernetesCluster{{ObjectMeta: metav1.ObjectMeta{Name: "c1"}, Spec: multiclusterv1alpha1.KubernetesClusterSpec{Mode: multiclusterv1alpha1.ModeRelay},
		Status: multiclusterv1alpha1.KubernetesClusterStatus{Connected: true, AgentCertificate: &multiclusterv1alpha1.AgentCertificate{Serial: "abc"}}}}
	good := Workload{Context: "c1", Cluster: "c1", RootCA: []*x509.Certificate{root}, ClientCert: leaf(now.Add(-time.Hour), now.Add(23*time.Hour)), Lease: lease(now.Add(-3 * time.Second))}
	notFound := apierrors.NewNotFound(schema.GroupResource{Resource: "x"}, "y")
	for _, tc := range []struct {
		name string
		edit func(*Workload)
		area string
		want Severity
		msg  string
	}{
		{"healthy", func(*Workload) {}, AreaAgents, OK, "holds the leader Lease"},
		{"expired certificate", func(w *Workload) { w.ClientCert = leaf(now.Add(-2*time.Hour), now.Add(-time.Minute)) }, AreaAgents, Error, "client certificate expired 60s ago"},
		{"certificate from another CA", func(w *Workload) {
			w.ClientCert, _ = newCA(t, "agent", other, otherKey, now.Add(time.Hour), func(c *x509.Certificate) { c.IsCA, c.SerialNumber = false, big.NewInt(0xabc) })
		}, AreaAgents, Error, "not from the relay CA"},
		{"other serial", func(w *Workload) {
			w.ClientCert, _ = newCA(t, "agent", root, rootKey, now.Add(23*time.Hour), func(c *x509.Certificate) {
				c.IsCA, c.SerialNumber, c.ExtKeyUsage = false, big.NewInt(0xdef), []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
			})
		}, AreaAgents, Warning, "holds certificate def, but the server last issued abc"},
		{"no certificate", func(w *Workload) { w.ClientCert, w.ClientCertErr = nil, notFound }, AreaAgents, Error, "has not bootstrapped"},
		{"pins another root", func(w *Workload) { w.RootCA = []*x509.Certificate{other} }, AreaAgents, Error, "pins a relay root that is not the server's"},
		{"stale lease", func(w *Workload) { w.Lease = lease(now.Add(-time.Minute)) }, AreaAgents, Error, "no agent is running"},
		{"released lease", func(w *Workload) { w.Lease.Spec.HolderIdentity = nil }, AreaAgents, Error, "no agent holds the leader Lease"},
		{"no lease", func(w *Workload) { w.Lease, w.LeaseErr = nil, notFound }, AreaAgents, Warning, "cannot tell whether an agent runs"},
		{"istio CRDs missing", func(w *Workload) { w.MissingIstioCRDs = []string{"virtualservices.networking.istio.io"} }, AreaCRDs, Error, "virtualservices.networking.istio.io"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := good
			l := *good.Lease
			w.Lease = &l
			tc.edit(&w)
			o := &Observations{RelayRoots: []*x509.Certificate{root}, Clusters: registered, Workloads: []Workload{w}}
			s, msg := worst(find(Evaluate(o, now), tc.area, "c1"))
			assert.Equal(t, tc.want, s, msg)
			assert.Contains(t, msg, tc.msg)
		})
	}
}

func TestEvaluateVirtualMeshesAndIstiod(t *testing.T) {
	root, rootKey := newCA(t, "mesh root", nil, nil, now.Add(365*24*time.Hour), nil)
	old, _ := newCA(t, "old root", nil, nil, now.Add(365*24*time.Hour), nil)
	constrained, _ := newCA(t, "intermediate", root, rootKey, now.Add(300*24*time.Hour), func(c *x509.Certificate) {
		c.PermittedURIDomains, c.ExcludedURIDomains, c.PermittedDNSDomainsCritical = []string{"c1.local"}, []string{".c1.local"}, true
	})
	open, _ := newCA(t, "intermediate", root, rootKey, now.Add(300*24*time.Hour), nil)
	ref := common.ClusterObjectRef{ClusterName: "c1", Namespace: "istio-system", Name: "istiod"}
	vm := func(mod func(*networkingv1alpha1.VirtualMesh)) networkingv1alpha1.VirtualMesh {
		notAfter := metav1.NewTime(now.Add(3650 * 24 * time.Hour))
		v := networkingv1alpha1.VirtualMesh{ObjectMeta: metav1.ObjectMeta{Namespace: "relaymesh", Name: "vm"},
			Spec: networkingv1alpha1.VirtualMeshSpec{Meshes: []common.ClusterObjectRef{ref}, MTLS: &networkingv1alpha1.MTLSConfig{Shared: &networkingv1alpha1.SharedTrust{}}},
			Status: networkingv1alpha1.VirtualMeshStatus{Status: common.Status{State: "Accepted"}, SharedTrust: &networkingv1alpha1.SharedTrustStatus{RootSubject: "root", RootNotAfter: &notAfter,
				Meshes: []networkingv1alpha1.MeshCAStatus{{Mesh: discoveryv1alpha1.Name(discoveryv1alpha1.OriginMesh, "c1", "istio-system", "istiod"), Cluster: "c1",
					NotBefore: metav1.NewTime(now.Add(-24 * time.Hour)), NotAfter: metav1.NewTime(now.Add(300 * 24 * time.Hour))}}}}}
		if mod != nil {
			mod(&v)
		}
		return v
	}
	mesh := MeshCA{VirtualMesh: "relaymesh/vm", Cluster: "c1", Namespace: "istio-system", Reachable: true, Intermediate: constrained, Roots: []*x509.Certificate{root},
		TrustDomain: "c1.local", IstiodRoots: []*x509.Certificate{root}}
	for _, tc := range []struct {
		name string
		vm   networkingv1alpha1.VirtualMesh
		mesh func(*MeshCA)
		area string
		want Severity
		msg  string
	}{
		{"healthy", vm(nil), nil, AreaVirtualMeshes, OK, "rotation: not rotating"},
		{"healthy istiod", vm(nil), nil, AreaIstiod, OK, "istiod uses the cacerts of relaymesh/vm"},
		{"invalid", vm(func(v *networkingv1alpha1.VirtualMesh) {
			v.Status.State, v.Status.Errors = "Invalid", []string{"spec.meshes[0]: no such mesh"}
		}), nil, AreaVirtualMeshes, Error, "Invalid: spec.meshes[0]: no such mesh"},
		{"held", vm(func(v *networkingv1alpha1.VirtualMesh) { v.Status.SharedTrust.Message = "root secret missing" }), nil, AreaVirtualMeshes, Error, "held: root secret missing"},
		{"root expiring", vm(func(v *networkingv1alpha1.VirtualMesh) {
			t := metav1.NewTime(now.Add(10 * 24 * time.Hour))
			v.Status.SharedTrust.RootNotAfter = &t
		}), nil, AreaVirtualMeshes, Warning, "root root expires in 10d"},
		{"intermediate expiring", vm(func(v *networkingv1alpha1.VirtualMesh) {
			v.Status.SharedTrust.Meshes[0].NotBefore = metav1.NewTime(now.Add(-360 * 24 * time.Hour))
			v.Status.SharedTrust.Meshes[0].NotAfter = metav1.NewTime(now.Add(2 * 24 * time.Hour))
		}), nil, AreaVirtualMeshes, Error, "intermediate of c1's mesh expires in 2d"},
		{"mesh without intermediate", vm(func(v *networkingv1alpha1.VirtualMesh) { v.Status.SharedTrust.Meshes = nil }), func(m *MeshCA) { m.Intermediate = nil }, AreaVirtualMeshes, Warning, "no intermediate issued yet to c1/istio-system/istiod"},
		{"intermediate not in the status, but in the cluster", vm(func(v *networkingv1alpha1.VirtualMesh) { v.Status.SharedTrust.Meshes = nil }), nil, AreaVirtualMeshes, OK, "the intermediate of c1's mesh (from its cacerts) expires in"},
		{"rotating", vm(func(v *networkingv1alpha1.VirtualMesh) {
			v.Status.Rotation = &networkingv1alpha1.RotationStatus{Phase: networkingv1alpha1.PhasePropagatingNewIntermediate, Step: 2, PendingMeshes: []string{"c1"}}
		}), nil, AreaVirtualMeshes, Warning, "rotation in PropagatingNewIntermediate (step 2), waiting for c1"},
		{"awaiting continue", vm(func(v *networkingv1alpha1.VirtualMesh) {
			v.Status.Rotation = &networkingv1alpha1.RotationStatus{Phase: networkingv1alpha1.PhaseAddingNewRoot, Step: 1, AwaitingContinue: true}
		}), nil, AreaVirtualMeshes, Warning, "relaymesh ca rotate continue relaymesh/vm"},
		{"rotation failed", vm(func(v *networkingv1alpha1.VirtualMesh) {
			v.Status.Rotation = &networkingv1alpha1.RotationStatus{Phase: networkingv1alpha1.PhaseFailed, Message: "new root unreadable"}
		}), nil, AreaVirtualMeshes, Error, "rotation failed: new root unreadable"},
		{"istiod on the old CA", vm(nil), func(m *MeshCA) { m.IstiodRoots = []*x509.Certificate{old} }, AreaIstiod, Error, "istiod is not using the cacerts Relaymesh wrote"},
		{"istiod with half the bundle", vm(nil), func(m *MeshCA) { m.Roots = []*x509.Certificate{root, old} }, AreaIstiod, Error, "restart istiod"},
		{"istiod not running", vm(nil), func(m *MeshCA) {
			m.IstiodRoots, m.IstiodRootsErr = nil, apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, "istio-ca-root-cert")
		}, AreaIstiod, Error, "is istiod running"},
		{"no cacerts", vm(nil), func(m *MeshCA) {
			m.CACertsErr = apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, "cacerts")
		}, AreaIstiod, Error, "no cacerts Secret"},
		{"unconstrained intermediate", vm(nil), func(m *MeshCA) { m.Intermediate = open }, AreaIstiod, Error, "not name-constrained"},
		{"no credentials", vm(nil), func(m *MeshCA) { *m = MeshCA{VirtualMesh: "relaymesh/vm", Cluster: "c1", Namespace: "istio-system"} }, AreaIstiod, Warning, "no credentials for cluster c1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mesh
			if tc.mesh != nil {
				tc.mesh(&m)
			}
			o := &Observations{VirtualMeshes: []networkingv1alpha1.VirtualMesh{tc.vm}, Meshes: []MeshCA{m}}
			s, msg := worst(find(Evaluate(o, now), tc.area, ""))
			assert.Equal(t, tc.want, s, msg)
			assert.Contains(t, msg, tc.msg)
		})
	}
}

func TestEvaluateWebhook(t *testing.T) {
	fail, ignore := admissionregistrationv1.Fail, admissionregistrationv1.Ignore
	hook := func(fp *admissionregistrationv1.FailurePolicyType) *admissionregistrationv1.ValidatingWebhookConfiguration {
		return &admissionregistrationv1.ValidatingWebhookConfiguration{Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "validate.relaymesh.io", FailurePolicy: fp}}}
	}
	authenticated := metrics(t, `relaymesh_admission_webhook_info{client_auth="certificate",failure_policy="Fail"} 1`+"\n")
	open := metrics(t, `relaymesh_admission_webhook_info{client_auth="none",failure_policy="Fail"} 1`+"\n")
	for _, tc := range []struct {
		name string
		o    Observations
		want Severity
		msg  string
	}{
		{"healthy", Observations{Webhook: Webhook{Config: hook(&fail), DryRunRan: true}, Metrics: authenticated}, OK, "answers only the apiserver's client certificate"},
		{"denied is reachable", Observations{Webhook: Webhook{Config: hook(&fail), DryRunRan: true, DryRunErr: errors.New(`admission webhook "validate.relaymesh.io" denied the request: no`)}, Metrics: authenticated}, OK, "judged"},
		{"unreachable", Observations{Webhook: Webhook{Config: hook(&fail), DryRunRan: true, DryRunErr: errors.New(`Internal error occurred: failed calling webhook "validate.relaymesh.io": connection refused`)}, Metrics: authenticated}, Error, "cannot call the webhook"},
		{"ignore", Observations{Webhook: Webhook{Config: hook(&ignore), DryRunRan: true}, Metrics: authenticated}, Warning, "failure policy Ignore (WEAKER)"},
		{"unauthenticated", Observations{Webhook: Webhook{Config: hook(&fail), DryRunRan: true}, Metrics: open}, Warning, "--webhook-allow-unauthenticated"},
		{"not served", Observations{Webhook: Webhook{Config: hook(&fail), DryRunRan: true}, Metrics: metrics(t, "relaymesh_relay_connected_agents 0\n")}, Warning, "this server does not serve it"},
		{"metrics unreadable", Observations{Webhook: Webhook{Config: hook(&fail), DryRunRan: true}}, Warning, "cannot tell whether the webhook authenticates"},
		{"none", Observations{Webhook: Webhook{NotFound: true}}, Warning, "no admission webhook registered"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, msg := worst(find(Evaluate(&tc.o, now), AreaWebhook, ""))
			assert.Equal(t, tc.want, s, msg)
			assert.Contains(t, msg, tc.msg)
		})
	}
}

func TestReport(t *testing.T) {
	r := NewReport(now, []Result{{Area: AreaWebhook, Subject: "w", Severity: Warning}, {Area: AreaCRDs, Subject: "b"}, {Area: AreaCRDs, Subject: "a"}})
	assert.Equal(t, []string{"a", "b", "w"}, []string{r.Results[0].Subject, r.Results[1].Subject, r.Results[2].Subject})
	assert.Equal(t, 1, r.ExitCode())
	assert.Equal(t, "2 ok, 1 warnings, 0 errors", r.Line())
	r = NewReport(now, append(r.Results, Result{Area: AreaServer, Severity: Error}))
	assert.Equal(t, 2, r.ExitCode())
	assert.Equal(t, 0, NewReport(now, nil).ExitCode())
	b, err := Warning.MarshalText()
	require.NoError(t, err)
	var s Severity
	require.NoError(t, s.UnmarshalText(b))
	assert.Equal(t, Warning, s)
	assert.Error(t, s.UnmarshalText([]byte("fine")))
}

func TestEvaluateReplicas(t *testing.T) {
	lease := func(name, holder string, renewed time.Duration, secs int32) coordinationv1.Lease {
		l := coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: &secs}}
		if holder != "" {
			l.Spec.HolderIdentity = &holder
		}
		if renewed >= 0 {
			l.Spec.RenewTime = &metav1.MicroTime{Time: now.Add(-renewed)}
		}
		return l
	}
	leader := func(holder string, renewed time.Duration) *coordinationv1.Lease {
		l := lease("relaymesh-server", holder, renewed, 8)
		return &l
	}
	alive := []coordinationv1.Lease{lease("relaymesh-replica-b", "b", 2*time.Second, 15), lease("relaymesh-replica-a", "a", time.Second, 15)}
	// withStore copies leases with each one's snapshot-store annotation.
	withStore := func(leases []coordinationv1.Lease, states ...string) []coordinationv1.Lease {
		out := make([]coordinationv1.Lease, len(leases))
		for i, l := range leases {
			l.Annotations = map[string]string{"relaymesh.io/snapshot-store": states[i]}
			out[i] = l
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		o       Observations
		subject string
		want    Severity
		msg     string
	}{
		{"a replica leads", Observations{ServerLease: leader("a", 3*time.Second), ReplicaLeases: alive}, "replicas", OK, "replica a leads"},
		{"replicas renewing", Observations{ServerLease: leader("a", 3*time.Second), ReplicaLeases: alive}, "replicas", OK, "2 replica(s) renewing their Leases: a, b"},
		{"leader Lease expired", Observations{ServerLease: leader("a", 20*time.Second), ReplicaLeases: alive}, "replicas", Error, "replica a last renewed the Lease relaymesh-server 20s ago (it lasts 8s)"},
		{"leader Lease released", Observations{ServerLease: leader("", 20*time.Second)}, "replicas", Error, "no replica holds the Lease relaymesh-server"},
		{"leader Lease never renewed", Observations{ServerLease: leader("a", -1)}, "replicas", Error, "wait for a leader"},
		{"leader election off", Observations{Namespace: "relaymesh", ServerLeaseErr: apierrors.NewNotFound(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "relaymesh-server")}, "replicas", Warning, "--leader-elect=false"},
		{"Lease unreadable", Observations{ServerLeaseErr: errors.New("forbidden")}, "replicas", Warning, "cannot read the Lease"},
		{"replicas unlistable", Observations{ServerLease: leader("a", time.Second), ReplicaLeasesErr: errors.New("forbidden")}, "replicas", Warning, "cannot list the replicas' Leases"},
		{"a replica stopped renewing", Observations{ServerLease: leader("a", time.Second), ReplicaLeases: append(alive, lease("relaymesh-replica-c", "c", 5*time.Minute, 15))},
			"replica relaymesh-replica-c", Warning, "not renewed for 5m (it lasts 15s): the replica crashed or is cut off"},
		{"every replica reaches redis", Observations{ServerLease: leader("a", time.Second), ReplicaLeases: withStore(alive, "reachable", "reachable")},
			"snapshot store", OK, "2 replica(s) reach the snapshot store"},
		{"one replica cut off from redis", Observations{ServerLease: leader("a", time.Second), ReplicaLeases: withStore(alive, "reachable", "unreachable")},
			"snapshot store", Warning, "replica(s) a cannot reach the snapshot store (Redis) while others can"},
		{"redis down", Observations{ServerLease: leader("a", time.Second), ReplicaLeases: withStore(alive, "unreachable", "unreachable")},
			"snapshot store", Error, "no replica reaches the snapshot store"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, msg := worst(find(Evaluate(&tc.o, now), AreaServer, tc.subject))
			assert.Equal(t, tc.want, s, msg)
			assert.Contains(t, msg, tc.msg)
		})
	}
}

// check reports a trust domain two clusters hold without both sharing it,
// one shared (WEAKER), a mesh reporting a trust domain outside its
// cluster's grant, and one trust domain reported by several meshes.
func TestEvaluateTrustDomains(t *testing.T) {
	kc := func(name string, grants ...multiclusterv1alpha1.TrustDomainGrant) multiclusterv1alpha1.KubernetesCluster {
		return multiclusterv1alpha1.KubernetesCluster{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: multiclusterv1alpha1.KubernetesClusterSpec{TrustDomains: grants}}
	}
	mesh := func(cluster, ns, td string) discoveryv1alpha1.Mesh {
		return discoveryv1alpha1.Mesh{Spec: discoveryv1alpha1.MeshSpec{Istio: &discoveryv1alpha1.IstioMesh{
			Installation: discoveryv1alpha1.MeshInstallation{Name: "istiod", Namespace: ns, Cluster: cluster}, TrustDomain: td}}}
	}
	two := []multiclusterv1alpha1.KubernetesCluster{kc("cluster-1"), kc("eu")}
	shared := multiclusterv1alpha1.TrustDomainGrant{Name: "cluster.local", Shared: true}
	for _, tc := range []struct {
		name     string
		o        Observations
		subject  string
		want     Severity
		msg      string
		findings int // results in the area
	}{
		{"every mesh in its grant", Observations{Clusters: two, Discovered: []discoveryv1alpha1.Mesh{mesh("cluster-1", "istio-system", "cluster-1.local"), mesh("eu", "istio-system", "eu.local")}},
			"meshes", OK, "2 mesh(es), each reporting a trust domain its cluster is granted alone", 1},
		{"a mesh reporting another cluster's trust domain", Observations{Clusters: two, Discovered: []discoveryv1alpha1.Mesh{mesh("cluster-1", "istio-system", "cluster-1.local"), mesh("eu", "istio-system", "cluster-1.local")}},
			"mesh eu/istio-system/istiod", Error, `reports trust domain "cluster-1.local": cluster eu is not granted trust domain "cluster-1.local" (its grant: eu.local)`, 2},
		{"and the claim by two meshes", Observations{Clusters: two, Discovered: []discoveryv1alpha1.Mesh{mesh("cluster-1", "istio-system", "cluster-1.local"), mesh("eu", "istio-system", "cluster-1.local")}},
			"cluster-1.local", Error, "claimed by 2 meshes (cluster-1/istio-system/istiod, eu/istio-system/istiod)", 2},
		{"two meshes of one cluster", Observations{Clusters: two, Discovered: []discoveryv1alpha1.Mesh{mesh("eu", "istio-system", "eu.local"), mesh("eu", "istio-canary", "eu.local")}},
			"eu.local", Warning, "claimed by 2 meshes (eu/istio-canary/istiod, eu/istio-system/istiod): either's CA", 1},
		{"a grant held twice", Observations{Clusters: []multiclusterv1alpha1.KubernetesCluster{kc("cluster-1"), kc("eu", multiclusterv1alpha1.TrustDomainGrant{Name: "cluster-1.local"})}},
			"cluster-1.local", Error, `trust domain "cluster-1.local" is granted to clusters cluster-1, eu, and cluster-1, eu do not mark it shared`, 1},
		{"a grant shared by every holder", Observations{Clusters: []multiclusterv1alpha1.KubernetesCluster{kc("c1", shared), kc("c2", shared)},
			Discovered: []discoveryv1alpha1.Mesh{mesh("c1", "istio-system", "cluster.local"), mesh("c2", "istio-system", "cluster.local")}},
			"cluster.local", Warning, "shared by clusters c1, c2 (WEAKER", 2},
		{"an unregistered cluster's mesh", Observations{Clusters: two, Discovered: []discoveryv1alpha1.Mesh{mesh("gone", "istio-system", "gone.local")}},
			"mesh gone/istio-system/istiod", Error, "cluster gone is not registered", 1},
		{"no trust domain", Observations{Clusters: two, Discovered: []discoveryv1alpha1.Mesh{mesh("eu", "istio-system", "")}},
			"mesh eu/istio-system/istiod", Error, "reports no trust domain", 1},
		{"meshes unreadable", Observations{Clusters: two, DiscoveredErr: errors.New("forbidden")}, "meshes", Warning, "cannot list the discovered Meshes: forbidden", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			all := find(Evaluate(&tc.o, now), AreaTrustDomains, "")
			assert.Len(t, all, tc.findings, "%v", all)
			s, msg := worst(find(all, AreaTrustDomains, tc.subject))
			assert.Equal(t, tc.want, s, msg)
			assert.Contains(t, msg, tc.msg)
		})
	}
	assert.Empty(t, find(Evaluate(&Observations{ClustersErr: errors.New("forbidden")}, now), AreaTrustDomains, ""), "an unreadable registry is the agents' finding")
}

// The dashboard's transport, as the server's metric reports it: plain
// HTTP off loopback is an error, on loopback a warning, TLS fine.
func TestEvaluateDashboard(t *testing.T) {
	info := func(tls, listener string) opsclient.Metrics {
		return metrics(t, `relaymesh_dashboard_info{listener="`+listener+`",tls="`+tls+`"} 1`+"\n")
	}
	for _, tc := range []struct {
		name    string
		metrics opsclient.Metrics
		want    Severity
		msg     string
	}{
		{"plain HTTP off loopback", info("none", "network"), Error, "served over plain HTTP off loopback"},
		{"plain HTTP on loopback", info("none", "loopback"), Warning, "--dashboard-plain-http, WEAKER"},
		{"relay CA", info("relay-ca", "network"), OK, "certificate from the relay CA"},
		{"provided", info("files", "network"), OK, "provided certificate"},
		{"unknown transport", info("quantum", "network"), Warning, `"quantum"`},
		{"not served", metrics(t, "relaymesh_relay_connected_agents 0\n"), OK, "serves no dashboard"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &Observations{Metrics: tc.metrics}
			o.Dashboard = gatherDashboard(o.Metrics)
			s, msg := worst(find(Evaluate(o, now), AreaDashboard, ""))
			assert.Equal(t, tc.want, s, msg)
			assert.Contains(t, msg, tc.msg)
		})
	}
	// Metrics that could not be read say nothing of the dashboard (the
	// agents' row reports them).
	assert.Empty(t, find(Evaluate(&Observations{MetricsErr: errors.New("refused")}, now), AreaDashboard, ""))
}

// The relay root rotation in every phase: Idle names the relay CA's
// generation, a rotation in progress is a warning naming its phase, age and
// the agents it has not heard from, a refusal is an error on the agent's
// cluster, and a rotation that outlasts its grace is an error with the
// commands to run.
func TestEvaluateRelayRootRotation(t *testing.T) {
	oldRoot, _ := newCA(t, "relay root 1", nil, nil, now.Add(3*365*24*time.Hour), nil)
	newRoot, _ := newCA(t, "relay root 2", nil, nil, now.Add(10*365*24*time.Hour), nil)
	oldFP, newFP := ca.RootFingerprint(oldRoot), ca.RootFingerprint(newRoot)
	state := func(phase ca.RootPhase, ago time.Duration, rolledBack bool) ca.RootRotationState {
		st := ca.RootRotationState{Phase: phase, Old: oldFP, New: newFP, Revision: 1, Since: now.Add(-ago), RolledBack: rolledBack}
		if phase == ca.RootIdle {
			st = ca.RootRotationState{Phase: ca.RootIdle, Old: oldFP, Revision: 4}
		}
		return st
	}
	bundle := func(st ca.RootRotationState) string { return ca.BundleFingerprint(st.Effective().Bundle) }
	kc := func(name string, mode multiclusterv1alpha1.RegistrationMode, connected bool, ann map[string]string) multiclusterv1alpha1.KubernetesCluster {
		c := multiclusterv1alpha1.KubernetesCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann}}
		c.Spec.Mode, c.Status.Connected = mode, connected
		return c
	}
	fleet := func(st ca.RootRotationState, refused string) []multiclusterv1alpha1.KubernetesCluster {
		cs := []multiclusterv1alpha1.KubernetesCluster{
			kc("acked", multiclusterv1alpha1.ModeRelay, true, map[string]string{ca.AnnotationRelayBundleAck: bundle(st)}),
			kc("b-slow", multiclusterv1alpha1.ModeRelay, true, map[string]string{ca.AnnotationRelayBundleAck: "an-older-bundle"}),
			kc("kubeconfig", multiclusterv1alpha1.ModeKubeconfig, true, nil),
			kc("z-offline", multiclusterv1alpha1.ModeRelay, false, nil),
		}
		if refused != "" {
			cs = append(cs, kc("old-agent", multiclusterv1alpha1.ModeRelay, true, map[string]string{ca.AnnotationRelayBundleRefused: refused}))
		}
		return cs
	}
	obs := func(st ca.RootRotationState, req ca.RootRequest, clusters []multiclusterv1alpha1.KubernetesCluster) Observations {
		r := &RelayRotation{State: st, Request: req, Current: oldRoot, Grace: DefaultRelayRootGrace}
		if st.Phase != ca.RootIdle {
			r.Staged = newRoot
		}
		return Observations{Namespace: "ns", RelayRoots: []*x509.Certificate{oldRoot}, IssuerGeneration: 3, RelayRotation: r, Clusters: clusters}
	}
	withGrace := func(st ca.RootRotationState, grace time.Duration) ca.RootRotationState { st.Grace = grace; return st }
	adding := state(ca.RootAddingNew, 10*time.Minute, false)
	switching := state(ca.RootSwitching, 25*time.Hour, false)
	removing := state(ca.RootRemovingOld, 5*time.Minute, false)
	many := []multiclusterv1alpha1.KubernetesCluster{}
	for i := range 25 {
		many = append(many, kc(fmt.Sprintf("c-%02d", i), multiclusterv1alpha1.ModeRelay, i%2 == 0, nil))
	}
	for _, tc := range []struct {
		name    string
		o       Observations
		subject string
		want    Severity
		msgs    []string
		not     []string
	}{
		{"idle names the generation", obs(state(ca.RootIdle, 0, false), "", fleet(adding, "")), "ns/relay-root-tls-secret", OK,
			[]string{"relay CA: root " + oldFP[:16], "relay root 1", "issuing CA generation 3", "no root rotation in progress (4 transitions so far)"}, []string{"b-slow", "pending"}},
		{"idle with a start pending", obs(state(ca.RootIdle, 0, false), ca.RootRequestStart, nil), "ns/relay-root-tls-secret", OK,
			[]string{"a start request is pending", "acts on the pending start request"}, nil},
		{"adding: who has not acknowledged", obs(adding, "", fleet(adding, "")), "ns/relay-root-tls-secret", Warning,
			[]string{"phase AddingNewRoot for 10m", "root " + oldFP[:16], "→ " + newFP[:16], "relay root 2", "issuing CA generation 3",
				"2 agent(s) have not acknowledged the bundle of this phase, 1 of them connected: b-slow (connected), z-offline (offline)", "next: every connected agent"},
			[]string{"acked (", "kubeconfig", "stuck"}},
		{"adding: a refusal is the agent's error", obs(adding, "", fleet(adding, bundle(adding)[:8]+": the agent does not handle trust bundles (upgrade it)")), "old-agent", Error,
			[]string{"refused the relay trust bundle", "phase AddingNewRoot", "does not handle trust bundles", "relaymesh ca relay rotate rollback -n ns"}, nil},
		{"adding: the refusal is named in the rotation", obs(adding, "", fleet(adding, "x: no")), "ns/relay-root-tls-secret", Warning,
			[]string{"3 agent(s)", "2 of them connected", "old-agent (refused)"}, nil},
		{"adding: stuck past the grace", obs(state(ca.RootAddingNew, 25*time.Hour, false), "", fleet(adding, "")), "ns/relay-root-tls-secret", Error,
			[]string{"stuck for longer than 24h (from the grace of a server with the default --agent-cert-ttl", ": relay root rotation in phase AddingNewRoot for 25h", "relaymesh ca relay rotate status -n ns", "relaymesh ca relay rotate rollback -n ns", "b-slow (connected)"}, nil},
		{"adding: stuck past the grace the server recorded", obs(withGrace(state(ca.RootAddingNew, 2*time.Hour, false), time.Hour), "", fleet(adding, "")), "ns/relay-root-tls-secret", Error,
			[]string{"stuck for longer than 60m: relay root rotation in phase AddingNewRoot for 120m"}, []string{"default --agent-cert-ttl"}},
		{"adding: within the grace the server recorded", obs(withGrace(state(ca.RootAddingNew, 25*time.Hour, false), 48*time.Hour), "", fleet(adding, "")), "ns/relay-root-tls-secret", Warning,
			[]string{"phase AddingNewRoot for 25h"}, []string{"stuck"}},
		{"switching within twice the grace", obs(switching, "", fleet(switching, "")), "ns/relay-root-tls-secret", Warning,
			[]string{"phase Switching for 25h", "next: both roots stay accepted for the grace window"}, []string{"stuck"}},
		{"switching stuck", obs(state(ca.RootSwitching, 49*time.Hour, false), "", fleet(switching, "")), "ns/relay-root-tls-secret", Error,
			[]string{"stuck", "phase Switching", "longer than 2d", "rollback"}, nil},
		{"switching rolled back", obs(state(ca.RootSwitching, time.Hour, true), ca.RootRequestNone, nil), "ns/relay-root-tls-secret", Warning,
			[]string{"rolled back", "every relay-mode agent acknowledged"}, nil},
		{"removing, everyone acknowledged", obs(removing, "", []multiclusterv1alpha1.KubernetesCluster{kc("acked", multiclusterv1alpha1.ModeRelay, true, map[string]string{ca.AnnotationRelayBundleAck: bundle(removing)})}),
			"ns/relay-root-tls-secret", Warning, []string{"phase RemovingOldRoot for 5m", "every relay-mode agent acknowledged the bundle of this phase", "the new root is the relay root (Idle)"}, nil},
		{"removing stuck", obs(state(ca.RootRemovingOld, 30*time.Hour, false), "", fleet(removing, "")), "ns/relay-root-tls-secret", Error,
			[]string{"stuck", "RemovingOldRoot", "longer than 24h"}, nil},
		{"a pending rollback while adding", obs(adding, ca.RootRequestRollback, nil), "ns/relay-root-tls-secret", Warning,
			[]string{"next: the server's Lease holder acts on the pending rollback request"}, nil},
		{"a long list is cut", obs(adding, "", many), "ns/relay-root-tls-secret", Warning,
			[]string{"25 agent(s)", "13 of them connected", "c-00 (connected)", "c-18 (connected)", "and 15 more (relaymesh ca relay rotate status -n ns lists them)"}, []string{"c-20", "c-01 "}},
		{"clusters unreadable", func() Observations { o := obs(adding, "", nil); o.ClustersErr = errors.New("forbidden"); return o }(), "ns/relay-root-tls-secret", Warning,
			[]string{"the agents are unknown"}, nil},
		{"state unreadable", Observations{Namespace: "ns", RelayRoots: []*x509.Certificate{oldRoot}, RelayRotationErr: errors.New("annotation is not a revision")}, "ns/relay-root-tls-secret", Error,
			[]string{"cannot read the relay root rotation: annotation is not a revision", "relaymesh ca relay rotate status -n ns"}, nil},
		{"generation unreadable", func() Observations {
			o := obs(state(ca.RootIdle, 0, false), "", nil)
			o.IssuerGeneration, o.IssuerGenerationErr = 0, errors.New("not a generation number")
			return o
		}(), "", Error, []string{"not a generation number", "issuing CA generation unknown"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, msg := worst(find(Evaluate(&tc.o, now), AreaRelayCA, tc.subject))
			assert.Equal(t, tc.want, s, msg)
			for _, m := range tc.msgs {
				assert.Contains(t, msg, m)
			}
			for _, m := range tc.not {
				assert.NotContains(t, msg, m)
			}
		})
	}

	// No relay root Secret: nothing about a rotation (evalRelayCA already
	// says the roots cannot be read).
	for _, r := range Evaluate(&Observations{Namespace: "ns", RelayRootsErr: errors.New("not found")}, now) {
		assert.NotContains(t, r.Message, "rotation")
	}
	// A hostile refusal is quoted, cut, and never breaks the line.
	hostile := "x: \n\x1b[31m<script>alert(1)</script>" + strings.Repeat("A", 4096)
	rs := find(Evaluate(ptr(obs(adding, "", fleet(adding, hostile))), now), AreaRelayCA, "old-agent")
	require.Len(t, rs, 1)
	assert.NotContains(t, rs[0].Message, "\n")
	assert.NotContains(t, rs[0].Message, "\x1b")
	assert.Less(t, len(rs[0].Message), 1200)
}

func ptr[T any](v T) *T { return &v }
