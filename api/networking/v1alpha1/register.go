package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API group and version of this package.
var GroupVersion = schema.GroupVersion{Group: "networking.relaymesh.io", Version: "v1alpha1"}

// The resources of this package's kinds: the one spelling of each plural
// every client, informer, RBAC rule and test uses.
var (
	VirtualMeshes       = GroupVersion.WithResource("virtualmeshes")
	TrafficPolicies     = GroupVersion.WithResource("trafficpolicies")
	AccessPolicies      = GroupVersion.WithResource("accesspolicies")
	VirtualDestinations = GroupVersion.WithResource("virtualdestinations")
	// FederatedTrustDomains are foreign SPIFFE trust domains: operator
	// configuration in the server's namespace, not user intent, so not
	// among Resources (no admission, no translation).
	FederatedTrustDomains = GroupVersion.WithResource("federatedtrustdomains")
)

// Resources are the resources of the user kinds, in the order above (the
// admission webhook and RBAC rules list them).
func Resources() []string {
	return []string{VirtualMeshes.Resource, TrafficPolicies.Resource, AccessPolicies.Resource, VirtualDestinations.Resource}
}

var (
	schemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme registers this package's kinds with a scheme.
	AddToScheme = schemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&VirtualMesh{}, &VirtualMeshList{},
		&TrafficPolicy{}, &TrafficPolicyList{},
		&AccessPolicy{}, &AccessPolicyList{},
		&VirtualDestination{}, &VirtualDestinationList{},
		&FederatedTrustDomain{}, &FederatedTrustDomainList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
