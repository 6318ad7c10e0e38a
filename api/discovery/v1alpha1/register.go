package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API group and version of this package.
var GroupVersion = schema.GroupVersion{Group: "discovery.relaymesh.io", Version: "v1alpha1"}

// The resources of this package's kinds.
var (
	Meshes       = GroupVersion.WithResource("meshes")
	Workloads    = GroupVersion.WithResource("workloads")
	Destinations = GroupVersion.WithResource("destinations")
)

var (
	schemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme registers this package's kinds with a scheme.
	AddToScheme = schemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&Mesh{}, &MeshList{},
		&Workload{}, &WorkloadList{},
		&Destination{}, &DestinationList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
