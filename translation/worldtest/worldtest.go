// Package worldtest builds synthetic fleets — "worlds" — as a
// translation.Input: registered clusters with one Istio mesh each, services
// with their workloads and Destinations, policies, and a VirtualMesh. The
// benchmarks and tests of translation (translation/controller), of the
// access audit (policy/accessaudit) and of the dashboard's Access page
// build their fleets here, so a number in docs/benchmarks.md for one is a
// number about the same kind of fleet as for the others, and a change to
// what a fleet looks like is made once.
//
// It imports only api/ and translation, so any package that tests
// translation or a view above it can use it without an import cycle, and
// no production code imports it. Worlds are deterministic: the same Spec
// gives the same Input, object for object.
package worldtest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/translation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// AdminNamespace is the namespace of every management-cluster object a
// world holds: discovered objects, registrations and policies.
const AdminNamespace = "relaymesh"

// versions are the versions every service runs, one Workload each; every
// Destination has them as subsets of its "version" label.
var versions = []string{"v1", "v2"}

// created is the creation time of every policy and VirtualMesh (the
// translators order conflicting policies by it, then by name).
var created = metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))

// PolicyKind is one kind of policy a world holds. Policy p is on service
// p mod Services; "the next service" is service p+1 mod Services.
type PolicyKind int

const (
	// AllowNextAccount is an AccessPolicy letting the next service's
	// account reach the service.
	AllowNextAccount PolicyKind = iota
	// AllowNamespaceInCluster is an AccessPolicy letting every workload of
	// the service's namespace in the service's cluster reach it.
	AllowNamespaceInCluster
	// AllowNamespaceAnywhere is an AccessPolicy letting the service's
	// namespace in every cluster reach it (sources in other clusters reach
	// it only where it is federated to them).
	AllowNamespaceAnywhere
	// AllowNextAccountGET is AllowNextAccount for GET /api/* only.
	AllowNextAccountGET
	// ShiftSubsets is a TrafficPolicy for the workloads of the service's
	// cluster: requests under /p<N> (N the policy's index) go 90 % to
	// subset v1 and 10 % to v2.
	ShiftSubsets
)

// Federation is what a world's VirtualMesh federates.
type Federation int

const (
	// NoVirtualMesh: the world has no VirtualMesh; each mesh stands alone.
	NoVirtualMesh Federation = iota
	// FederatePublic: one VirtualMesh "all" of every mesh, denying by
	// default (global access policy Enabled), federates every service
	// labelled tier: public (every fifth) to every other mesh.
	FederatePublic
	// FederateAll: the same VirtualMesh federates every service to every
	// other mesh.
	FederateAll
)

// Spec is what a world holds. The zero Spec is an empty world.
type Spec struct {
	// Clusters are registered clusters cluster-0 … with the default trust
	// domain grant, each with one Istio mesh (istiod in istio-system,
	// trust domain <cluster>.local, an east-west gateway at 10.x.y.1).
	Clusters int
	// Services are spread over the clusters (service s in cluster s mod
	// Clusters): each is one Destination, port 8080 "http", labelled app:
	// svc-<s> and, every fifth, tier: public, with one Deployment per
	// version (v1, v2) running as the service's own account svc-<s>.
	Services int
	// Namespaces the services are spread over: service s lives in
	// ns-<s mod Namespaces>. Zero means one.
	Namespaces int
	// Policies in the admin namespace, named p-<N>, each on one service.
	Policies int
	// Mix is the kind of each policy in turn: policy p is
	// Mix[p mod len(Mix)]. A world with policies needs one.
	Mix []PolicyKind
	// Federation is the world's VirtualMesh, if any.
	Federation Federation
}

// Access is the fleet the access audit (policy/accessaudit) and the
// dashboard's Access page are measured with: services in 20 namespaces,
// policies AccessPolicies of every kind in turn (AllowNextAccount,
// AllowNamespaceInCluster, AllowNamespaceAnywhere, AllowNextAccountGET),
// and one VirtualMesh denying by default and federating every fifth
// service (FederatePublic).
func Access(clusters, services, policies int) Spec {
	return Spec{Clusters: clusters, Services: services, Namespaces: 20, Policies: policies,
		Mix:        []PolicyKind{AllowNextAccount, AllowNamespaceInCluster, AllowNamespaceAnywhere, AllowNextAccountGET},
		Federation: FederatePublic}
}

// Translation is the fleet translation (translation/controller) is
// measured and tested with: services in 20 namespaces, policies policies
// by turns a TrafficPolicy shifting between the service's subsets
// (ShiftSubsets) and an AccessPolicy letting the next service's account in
// (AllowNextAccount), and, when federate is true, one VirtualMesh denying
// by default and federating every service to every mesh (FederateAll); no
// VirtualMesh otherwise.
func Translation(clusters, services, policies int, federate bool) Spec {
	s := Spec{Clusters: clusters, Services: services, Namespaces: 20, Policies: policies, Mix: []PolicyKind{ShiftSubsets, AllowNextAccount}}
	if federate {
		s.Federation = FederateAll
	}
	return s
}

// New builds the world s describes. Every policy and the VirtualMesh are
// at generation 1 and Accepted for it, as a server that admitted them
// writes; discovered objects carry no UID (WithUIDs adds them). A Spec
// that cannot be built (a negative count, services without clusters,
// policies without services, an unknown policy kind) fails tb.
func New(tb testing.TB, s Spec) *translation.Input {
	tb.Helper()
	if s.Clusters < 0 || s.Services < 0 || s.Namespaces < 0 || s.Policies < 0 ||
		(s.Services > 0 && s.Clusters == 0) || (s.Policies > 0 && (s.Services == 0 || len(s.Mix) == 0)) {
		tb.Fatalf("worldtest: cannot build %+v: counts are not negative, services need clusters, policies need services and a mix", s)
	}
	namespaces := max(s.Namespaces, 1)
	for _, kind := range s.Mix {
		if kind < AllowNextAccount || kind > ShiftSubsets {
			tb.Fatalf("worldtest: unknown policy kind %d", kind)
		}
	}
	in := &translation.Input{}

	var meshRefs []common.ClusterObjectRef
	for c := range s.Clusters {
		cluster := clusterName(c)
		in.Meshes = append(in.Meshes, discoveryv1alpha1.Mesh{
			ObjectMeta: metav1.ObjectMeta{Name: meshOf(cluster).Name, Namespace: AdminNamespace},
			Spec: discoveryv1alpha1.MeshSpec{Istio: &discoveryv1alpha1.IstioMesh{
				Installation: discoveryv1alpha1.MeshInstallation{Name: "istiod", Namespace: "istio-system", Cluster: cluster},
				TrustDomain:  cluster + ".local", IstiodServiceAccount: "istiod",
				Gateways: []discoveryv1alpha1.GatewayInfo{{Name: "istio-eastwestgateway", Namespace: "istio-system", Kind: "EastWest",
					WorkloadLabels: map[string]string{"istio": "eastwestgateway"}, ExternalAddress: fmt.Sprintf("10.%d.%d.1", c/250, c%250), TLSPort: 15443}},
			}},
		})
		meshRefs = append(meshRefs, common.ClusterObjectRef{ClusterName: cluster, Namespace: "istio-system", Name: "istiod"})
		// No grant in the spec: the default one, <cluster>.local.
		in.Clusters = append(in.Clusters, multiclusterv1alpha1.KubernetesCluster{ObjectMeta: metav1.ObjectMeta{Name: cluster, Namespace: AdminNamespace},
			Spec: multiclusterv1alpha1.KubernetesClusterSpec{Mode: multiclusterv1alpha1.ModeRelay}})
	}

	service := func(i int) common.ClusterObjectRef {
		return common.ClusterObjectRef{Name: fmt.Sprintf("svc-%d", i), Namespace: fmt.Sprintf("ns-%d", i%namespaces), ClusterName: clusterName(i % s.Clusters)}
	}
	for i := range s.Services {
		svc := service(i)
		mesh := meshOf(svc.ClusterName)
		for _, v := range versions {
			deployment := common.ClusterObjectRef{Name: svc.Name + "-" + v, Namespace: svc.Namespace, ClusterName: svc.ClusterName}
			in.Workloads = append(in.Workloads, discoveryv1alpha1.Workload{
				ObjectMeta: metav1.ObjectMeta{Name: discoveryv1alpha1.Name(discoveryv1alpha1.OriginDeployment, deployment.ClusterName, deployment.Namespace, deployment.Name), Namespace: AdminNamespace},
				Spec: discoveryv1alpha1.WorkloadSpec{Mesh: mesh, Kubernetes: discoveryv1alpha1.KubernetesWorkload{
					Controller: deployment, Kind: "Deployment",
					PodLabels: map[string]string{"app": svc.Name, "version": v}, ServiceAccountName: svc.Name}},
			})
		}
		labels := map[string]string{"app": svc.Name}
		if i%5 == 0 {
			labels["tier"] = "public"
		}
		in.Destinations = append(in.Destinations, discoveryv1alpha1.Destination{
			ObjectMeta: metav1.ObjectMeta{Name: discoveryv1alpha1.Name(discoveryv1alpha1.OriginService, svc.ClusterName, svc.Namespace, svc.Name), Namespace: AdminNamespace},
			Spec: discoveryv1alpha1.DestinationSpec{Mesh: mesh, KubeService: discoveryv1alpha1.KubeService{
				Ref: svc, Labels: labels, WorkloadSelectorLabels: map[string]string{"app": svc.Name},
				Subsets: map[string][]string{"version": slices.Clone(versions)},
				Ports:   []discoveryv1alpha1.ServicePort{{Port: 8080, Name: "http"}}}},
		})
	}

	accepted := common.Status{State: common.StateAccepted, ObservedGeneration: 1}
	for p := range s.Policies {
		svc, next := service(p%s.Services), service((p+1)%s.Services)
		meta := metav1.ObjectMeta{Name: fmt.Sprintf("p-%d", p), Namespace: AdminNamespace, CreationTimestamp: created, Generation: 1}
		to := []common.DestinationSelector{{KubeServiceRefs: &common.KubeServiceRefs{Services: []common.ClusterObjectRef{svc}}}}
		nextAccount := []common.IdentitySelector{{KubeServiceAccountRefs: &common.KubeServiceAccountRefs{ServiceAccounts: []common.ClusterObjectRef{next}}}}
		access := networkingv1alpha1.AccessPolicySpec{DestinationSelector: to}
		switch s.Mix[p%len(s.Mix)] {
		case ShiftSubsets:
			subset := func(weight int32, version string) networkingv1alpha1.WeightedDestination {
				return networkingv1alpha1.WeightedDestination{Weight: weight,
					KubeService: &networkingv1alpha1.KubeServiceTarget{ClusterObjectRef: svc, Subset: map[string]string{"version": version}}}
			}
			tp := networkingv1alpha1.TrafficPolicy{ObjectMeta: meta, Spec: networkingv1alpha1.TrafficPolicySpec{
				DestinationSelector: to,
				SourceSelector:      []common.WorkloadSelector{{Clusters: []string{svc.ClusterName}}},
				HTTPRequestMatchers: []networkingv1alpha1.HTTPMatcher{{URI: &networkingv1alpha1.StringMatch{Prefix: new(fmt.Sprintf("/p%d", p))}}},
				Policy: networkingv1alpha1.Policy{TrafficShift: &networkingv1alpha1.TrafficShift{Destinations: []networkingv1alpha1.WeightedDestination{
					subset(90, "v1"), subset(10, "v2")}}},
			}}
			tp.Status.Status = accepted
			in.TrafficPolicies = append(in.TrafficPolicies, tp)
			continue
		case AllowNextAccount:
			access.SourceSelector = nextAccount
		case AllowNamespaceInCluster:
			access.SourceSelector = []common.IdentitySelector{{KubeIdentityMatcher: &common.KubeIdentityMatcher{Namespaces: []string{svc.Namespace}, Clusters: []string{svc.ClusterName}}}}
		case AllowNamespaceAnywhere:
			access.SourceSelector = []common.IdentitySelector{{KubeIdentityMatcher: &common.KubeIdentityMatcher{Namespaces: []string{svc.Namespace}}}}
		case AllowNextAccountGET:
			access.SourceSelector, access.AllowedMethods, access.AllowedPaths = nextAccount, []string{"GET"}, []string{"/api/*"}
		}
		ap := networkingv1alpha1.AccessPolicy{ObjectMeta: meta, Spec: access}
		ap.Status.Status = accepted
		in.AccessPolicies = append(in.AccessPolicies, ap)
	}

	if s.Federation == NoVirtualMesh {
		return in
	}
	federate := networkingv1alpha1.FederationSelector{} // every Destination
	if s.Federation == FederatePublic {
		federate.DestinationSelectors = []common.DestinationSelector{{KubeServiceMatcher: &common.KubeServiceMatcher{Labels: map[string]string{"tier": "public"}}}}
	}
	vm := networkingv1alpha1.VirtualMesh{
		ObjectMeta: metav1.ObjectMeta{Name: "all", Namespace: AdminNamespace, CreationTimestamp: created, Generation: 1},
		Spec: networkingv1alpha1.VirtualMeshSpec{Meshes: meshRefs, GlobalAccessPolicy: networkingv1alpha1.GlobalAccessEnabled,
			Federation: &networkingv1alpha1.Federation{Selectors: []networkingv1alpha1.FederationSelector{federate}}},
	}
	vm.Status.Status = accepted
	in.VirtualMeshes = []networkingv1alpha1.VirtualMesh{vm}
	return in
}

func clusterName(c int) string { return fmt.Sprintf("cluster-%d", c) }

// meshOf is the Mesh object of cluster's istiod, named as discovery names
// it.
func meshOf(cluster string) common.ObjectRef {
	return common.ObjectRef{Name: discoveryv1alpha1.Name(discoveryv1alpha1.OriginMesh, cluster, "istio-system", "istiod"), Namespace: AdminNamespace}
}

// WithUIDs gives every object of in a UID and at least generation 1, as
// objects read from an apiserver have (the translation engine versions
// objects by them), and returns in.
func WithUIDs(in *translation.Input) *translation.Input {
	for n, o := range Objects(in) {
		o.SetUID(types.UID(fmt.Sprintf("uid-%d", n+1)))
		o.SetGeneration(max(o.GetGeneration(), 1))
	}
	return in
}

// Objects are every object of in, to read or change in place: meshes,
// workloads, destinations, TrafficPolicies, AccessPolicies, VirtualMeshes,
// VirtualDestinations and clusters, each kind in its order in in.
func Objects(in *translation.Input) []metav1.Object {
	var o []metav1.Object
	o = appendObjects(o, in.Meshes)
	o = appendObjects(o, in.Workloads)
	o = appendObjects(o, in.Destinations)
	o = appendObjects(o, in.TrafficPolicies)
	o = appendObjects(o, in.AccessPolicies)
	o = appendObjects(o, in.VirtualMeshes)
	o = appendObjects(o, in.VirtualDestinations)
	return appendObjects(o, in.Clusters)
}

func appendObjects[T any, P interface {
	*T
	metav1.Object
}](o []metav1.Object, objs []T) []metav1.Object {
	for i := range objs {
		o = append(o, P(&objs[i]))
	}
	return o
}
