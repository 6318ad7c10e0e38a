// Package outputs names what Relaymesh writes into a workload cluster: the
// Istio kinds its translators produce and its agents may apply, the owner
// label that marks an object as Relaymesh's, and the parents annotation
// that says which user objects produced it. The server, the agent, the
// operator views and the tests share these names; none keeps a copy.
//
// Like the rest of api/, it is a leaf: it imports no Relaymesh package.
package outputs

import "k8s.io/apimachinery/pkg/runtime/schema"

const (
	// OwnerLabel marks the objects an agent manages (its value names the
	// manager): it applies, prunes and changes only objects carrying its
	// value, never anyone else's.
	OwnerLabel = "relaymesh.io/owner"
	// ParentsAnnotation names the user objects an output was produced
	// from: comma-separated, sorted "<Kind>/<namespace>/<name>" references.
	ParentsAnnotation = "relaymesh.io/parents"
)

// The resources of the Istio kinds (plurals are not guessable: the
// networking.istio.io Gateway's is "gateways", a ServiceEntry's
// "serviceentries").
var (
	VirtualServices       = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "virtualservices"}
	DestinationRules      = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "destinationrules"}
	ServiceEntries        = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "serviceentries"}
	Gateways              = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "gateways"}
	AuthorizationPolicies = schema.GroupVersionResource{Group: "security.istio.io", Version: "v1", Resource: "authorizationpolicies"}
	PeerAuthentications   = schema.GroupVersionResource{Group: "security.istio.io", Version: "v1", Resource: "peerauthentications"}
)

// The resources of the Gateway API routes Relaymesh writes for ambient
// Destinations (gateway.networking.k8s.io, standard channel).
var (
	HTTPRoutes = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "httproutes"}
	GRPCRoutes = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "grpcroutes"}
	// TCPRoutes: an ambient VirtualDestination's hostname on a TCP, TLS or
	// HTTPS port (standard channel at v1 in the Gateway API Istio builds
	// with, v1.6; older releases had it only in the experimental channel).
	TCPRoutes = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "tcproutes"}
)

// GatewayRouteKinds returns the Gateway API kinds Relaymesh writes, with
// their resources (a fresh slice). A cluster without Gateway API's CRDs
// serves none of them; an agent treats them as optional kinds.
func GatewayRouteKinds() []IstioKind {
	return []IstioKind{
		{Kind: HTTPRoutes.GroupVersion().WithKind("HTTPRoute"), Resource: HTTPRoutes},
		{Kind: GRPCRoutes.GroupVersion().WithKind("GRPCRoute"), Resource: GRPCRoutes},
		{Kind: TCPRoutes.GroupVersion().WithKind("TCPRoute"), Resource: TCPRoutes},
	}
}

// IstioKind is one Istio kind Relaymesh writes, with its resource.
type IstioKind struct {
	Kind     schema.GroupVersionKind
	Resource schema.GroupVersionResource
}

// istioKinds is the one list of the Istio kinds Relaymesh's translators
// produce and an agent manages by default. All are namespaced.
var istioKinds = []IstioKind{
	{Kind: VirtualServices.GroupVersion().WithKind("VirtualService"), Resource: VirtualServices},
	{Kind: DestinationRules.GroupVersion().WithKind("DestinationRule"), Resource: DestinationRules},
	{Kind: ServiceEntries.GroupVersion().WithKind("ServiceEntry"), Resource: ServiceEntries},
	{Kind: Gateways.GroupVersion().WithKind("Gateway"), Resource: Gateways},
	{Kind: AuthorizationPolicies.GroupVersion().WithKind("AuthorizationPolicy"), Resource: AuthorizationPolicies},
	{Kind: PeerAuthentications.GroupVersion().WithKind("PeerAuthentication"), Resource: PeerAuthentications},
}

// IstioKinds returns the Istio kinds Relaymesh writes (a fresh slice: a
// caller may change it).
func IstioKinds() []IstioKind { return append([]IstioKind(nil), istioKinds...) }

// IstioGroupVersionKinds returns the kinds of IstioKinds, in order.
func IstioGroupVersionKinds() []schema.GroupVersionKind {
	out := make([]schema.GroupVersionKind, len(istioKinds))
	for i, k := range istioKinds {
		out[i] = k.Kind
	}
	return out
}

// IstioResources returns the resources of IstioKinds, in order.
func IstioResources() []schema.GroupVersionResource {
	out := make([]schema.GroupVersionResource, len(istioKinds))
	for i, k := range istioKinds {
		out[i] = k.Resource
	}
	return out
}

// IstioResource returns the resource of an Istio kind Relaymesh writes.
func IstioResource(kind schema.GroupKind) (schema.GroupVersionResource, bool) {
	for _, k := range istioKinds {
		if k.Kind.GroupKind() == kind {
			return k.Resource, true
		}
	}
	return schema.GroupVersionResource{}, false
}
