package dashboard

import (
	"context"
	"fmt"
	"time"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/internal/kubeauth"
	"github.com/relaymesh/relaymesh/translation"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// tokenAuth is a fake Authorizer for the package's own tests: tokens map
// to users, users to the views they may see. (The real one, against a real
// apiserver, is in dashboard_test.go.)
type tokenAuth struct {
	users map[string]string          // token → user
	allow map[string]map[string]bool // user → "verb group/resource" allowed
}

func (a tokenAuth) Authenticate(_ context.Context, token string) (*authenticationv1.UserInfo, error) {
	u, ok := a.users[token]
	if !ok {
		return nil, kubeauth.ErrUnauthenticated
	}
	return &authenticationv1.UserInfo{Username: u}, nil
}

func (a tokenAuth) Authorize(_ context.Context, u *authenticationv1.UserInfo, attrs authorizationv1.ResourceAttributes) error {
	if a.allow[u.Username]["*"] || a.allow[u.Username][attrs.Verb+" "+attrs.Group+"/"+attrs.Resource] {
		return nil
	}
	return kubeauth.ErrForbidden
}

// demoWorld is a small world: two clusters of one VirtualMesh with shared
// trust in the middle of a rotation, a policy, two federation peers (one
// Current, one Stale), and the given string in
// every free-text field (and in names, which the apiserver would refuse,
// but a page must not trust that).
func demoWorld(s string, now time.Time) *StaticSource {
	t := func(d time.Duration) metav1.Time { return metav1.NewTime(now.Add(d).UTC().Truncate(time.Second)) }
	name := func(base string) string {
		if s == "" {
			return base
		}
		return base + s
	}
	var clusters []multiclusterv1alpha1.KubernetesCluster
	for i, c := range []string{"cluster-1", "cluster-2"} {
		seen := t(-3 * time.Second)
		kc := multiclusterv1alpha1.KubernetesCluster{ObjectMeta: metav1.ObjectMeta{Name: name(c), Namespace: "relaymesh"},
			Spec: multiclusterv1alpha1.KubernetesClusterSpec{Mode: multiclusterv1alpha1.ModeRelay},
			Status: multiclusterv1alpha1.KubernetesClusterStatus{Connected: i == 0, LastSeen: &seen, AgentVersion: "v1.0.0" + s,
				AgentCertificate: &multiclusterv1alpha1.AgentCertificate{Serial: "ab12cd" + s, SPIFFEID: "spiffe://relaymesh.local/cluster/" + name(c) + "/agent", NotAfter: t(20 * time.Hour)}}}
		kc.Status.Errors = []string{s}
		clusters = append(clusters, kc)
	}
	in := &translation.Input{}
	var refs []common.ClusterObjectRef
	for _, c := range []string{"cluster-1", "cluster-2"} {
		mesh := discoveryv1alpha1.Name(discoveryv1alpha1.OriginMesh, c, "istio-system", "istiod")
		in.Meshes = append(in.Meshes, discoveryv1alpha1.Mesh{ObjectMeta: metav1.ObjectMeta{Name: mesh, Namespace: "relaymesh"},
			Spec: discoveryv1alpha1.MeshSpec{Istio: &discoveryv1alpha1.IstioMesh{Installation: discoveryv1alpha1.MeshInstallation{Name: "istiod", Namespace: "istio-system", Cluster: c},
				TrustDomain: c + ".local"}}})
		refs = append(refs, common.ClusterObjectRef{ClusterName: c, Namespace: "istio-system", Name: "istiod"})
		in.Clusters = append(in.Clusters, multiclusterv1alpha1.KubernetesCluster{ObjectMeta: metav1.ObjectMeta{Name: c, Namespace: "relaymesh"}}) // the default grant, <cluster>.local
		meshRef := common.ObjectRef{Name: mesh, Namespace: "relaymesh"}
		for _, app := range []string{"productpage", "reviews"} {
			svc := common.ClusterObjectRef{ClusterName: c, Namespace: "bookinfo", Name: app}
			in.Workloads = append(in.Workloads, discoveryv1alpha1.Workload{ObjectMeta: metav1.ObjectMeta{Name: discoveryv1alpha1.Name(discoveryv1alpha1.OriginDeployment, c, "bookinfo", app+"-v1"), Namespace: "relaymesh"},
				Spec: discoveryv1alpha1.WorkloadSpec{Mesh: meshRef, Kubernetes: discoveryv1alpha1.KubernetesWorkload{
					Controller: common.ClusterObjectRef{ClusterName: c, Namespace: "bookinfo", Name: app + "-v1"}, Kind: "Deployment",
					PodLabels: map[string]string{"app": app}, ServiceAccountName: "bookinfo-" + app}}})
			in.Destinations = append(in.Destinations, discoveryv1alpha1.Destination{ObjectMeta: metav1.ObjectMeta{Name: discoveryv1alpha1.Name(discoveryv1alpha1.OriginService, c, "bookinfo", app), Namespace: "relaymesh"},
				Spec: discoveryv1alpha1.DestinationSpec{Mesh: meshRef, KubeService: discoveryv1alpha1.KubeService{Ref: svc, Labels: map[string]string{"app": app},
					WorkloadSelectorLabels: map[string]string{"app": app}, Ports: []discoveryv1alpha1.ServicePort{{Port: 9080, Name: "http"}}}}})
		}
	}
	vm := networkingv1alpha1.VirtualMesh{ObjectMeta: metav1.ObjectMeta{Name: name("bookinfo-federation"), Namespace: "relaymesh", Generation: 1},
		Spec: networkingv1alpha1.VirtualMeshSpec{Meshes: refs, GlobalAccessPolicy: networkingv1alpha1.GlobalAccessEnabled,
			MTLS:       &networkingv1alpha1.MTLSConfig{Shared: &networkingv1alpha1.SharedTrust{RootCA: networkingv1alpha1.RootCA{Generated: &networkingv1alpha1.CertOptions{}}}},
			Federation: &networkingv1alpha1.Federation{Selectors: []networkingv1alpha1.FederationSelector{{}}}}}
	na := t(87600 * time.Hour)
	vm.Status.State, vm.Status.Errors, vm.Status.Warnings = common.StateAccepted, nil, []string{s}
	vm.Status.SharedTrust = &networkingv1alpha1.SharedTrustStatus{RootFingerprint: "00aa11bb22cc33dd44ee55ff66778899" + s, RootSubject: "O=relaymesh,CN=root" + s, RootNotAfter: &na, Message: s}
	since := t(-10 * time.Second)
	vm.Status.Rotation = &networkingv1alpha1.RotationStatus{Phase: networkingv1alpha1.PhasePropagatingNewIntermediate, Step: 2, LastTransitionTime: &since,
		OldRootFingerprint: "00aa11bb22cc33dd44ee55ff66778899" + s, NewRootFingerprint: "99887766ff55ee44dd33cc22bb11aa00" + s, Message: s}
	for i, c := range []string{"cluster-1", "cluster-2"} {
		mesh := discoveryv1alpha1.Name(discoveryv1alpha1.OriginMesh, c, "istio-system", "istiod")
		issuer := vm.Status.Rotation.NewRootFingerprint
		if i == 1 {
			issuer = vm.Status.Rotation.OldRootFingerprint
			vm.Status.Rotation.PendingMeshes = []string{mesh}
		}
		vm.Status.SharedTrust.Meshes = append(vm.Status.SharedTrust.Meshes, networkingv1alpha1.MeshCAStatus{Mesh: mesh, Cluster: c, TrustDomain: c + ".local" + s,
			Serial: fmt.Sprintf("5e%d", i) + s, NotBefore: t(-time.Hour), NotAfter: t(8759 * time.Hour), Issuer: issuer})
	}
	in.VirtualMeshes = []networkingv1alpha1.VirtualMesh{vm}
	ap := networkingv1alpha1.AccessPolicy{ObjectMeta: metav1.ObjectMeta{Name: name("productpage-to-reviews"), Namespace: "relaymesh", Generation: 2},
		Spec: networkingv1alpha1.AccessPolicySpec{
			SourceSelector:      []common.IdentitySelector{{KubeServiceAccountRefs: &common.KubeServiceAccountRefs{ServiceAccounts: []common.ClusterObjectRef{{ClusterName: "cluster-1", Namespace: "bookinfo", Name: "bookinfo-productpage"}}}}},
			DestinationSelector: []common.DestinationSelector{{KubeServiceMatcher: &common.KubeServiceMatcher{Labels: map[string]string{"app": "reviews"}}}},
			AllowedMethods:      []string{"GET"}, AllowedPaths: []string{"/api/" + s}}}
	ap.Status.State, ap.Status.ObservedGeneration, ap.Status.Errors = common.StateAccepted, 1, []string{s}
	ap.Status.Clusters = []common.ClusterApplyStatus{{Cluster: "cluster-1", State: common.ApplyApplied}, {Cluster: "cluster-2", State: common.ApplyFailed, Errors: []string{s}}}
	in.AccessPolicies = []networkingv1alpha1.AccessPolicy{ap}
	return &StaticSource{KubernetesClusters: clusters, In: in, Peers: demoPeers(s, now), Rev: "1"}
}

// demoPeers are two FederatedTrustDomains of the server's namespace: a
// Current SPIRE peer, and a Stale one whose last fetch was refused; s is
// in every free-text field (and in trust domains and URLs, which the
// apiserver would refuse, but a page must not trust that).
func demoPeers(s string, now time.Time) []networkingv1alpha1.FederatedTrustDomain {
	t := func(d time.Duration) *metav1.Time {
		at := metav1.NewTime(now.Add(d).UTC().Truncate(time.Second))
		return &at
	}
	root := func(fp string) networkingv1alpha1.FederatedRoot {
		return networkingv1alpha1.FederatedRoot{Fingerprint: fp + s, Subject: "O=SPIRE,CN=root" + s, NotAfter: *t(8760 * time.Hour)}
	}
	return []networkingv1alpha1.FederatedTrustDomain{
		{ObjectMeta: metav1.ObjectMeta{Name: "spire-peer", Namespace: "relaymesh"},
			Spec: networkingv1alpha1.FederatedTrustDomainSpec{TrustDomain: "spire.example" + s, BundleEndpointURL: "https://spire.example:8443/" + s, Profile: "https_web"},
			Status: networkingv1alpha1.FederatedTrustDomainStatus{State: networkingv1alpha1.FederatedCurrent, LastFetch: t(-time.Minute), LastAccepted: t(-2 * time.Hour),
				Sequence: 7, RefreshHint: 300, Roots: []networkingv1alpha1.FederatedRoot{root("c0ffee00c0ffee00c0ffee00c0ffee00")}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "stale-peer", Namespace: "relaymesh"},
			Spec: networkingv1alpha1.FederatedTrustDomainSpec{TrustDomain: "stale.example", BundleEndpointURL: "https://stale.example/bundle", Profile: "https_web"},
			Status: networkingv1alpha1.FederatedTrustDomainStatus{State: networkingv1alpha1.FederatedStale, Error: "refused: " + s, LastFetch: t(-30 * time.Second),
				LastAccepted: t(-26 * time.Hour), Sequence: 3, Roots: []networkingv1alpha1.FederatedRoot{root("deadbeefdeadbeefdeadbeefdeadbeef")}}},
	}
}
