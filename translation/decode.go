package translation

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/relaymesh/relaymesh/api"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := api.AddToScheme(s); err != nil {
		panic(err) // static registration of our own types; cannot fail at run time
	}
	return s
}()

// Decode adds the objects of a multi-document YAML or JSON stream (Mesh,
// Workload, Destination, VirtualMesh, TrafficPolicy, AccessPolicy,
// VirtualDestination, KubernetesCluster) to in. Decoding is strict: an unknown field or a kind
// that is not a translation input is an error naming the document.
func (in *Input) Decode(b []byte) error {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for i := 0; ; i++ {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("document %d: %w", i, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if u.GetAPIVersion() == "" || u.GetKind() == "" || u.GetName() == "" {
			return fmt.Errorf("document %d: apiVersion, kind and metadata.name are required", i)
		}
		obj, err := scheme.New(u.GroupVersionKind())
		if err != nil {
			return fmt.Errorf("document %d: %s is not a translation input", i, u.GetKind())
		}
		raw, err := u.MarshalJSON()
		if err != nil {
			return err
		}
		if err := yaml.UnmarshalStrict(raw, obj); err != nil {
			return fmt.Errorf("document %d (%s %s): %w", i, u.GetKind(), u.GetName(), err)
		}
		switch o := obj.(type) {
		case *discoveryv1alpha1.Mesh:
			in.Meshes = append(in.Meshes, *o)
		case *discoveryv1alpha1.Workload:
			in.Workloads = append(in.Workloads, *o)
		case *discoveryv1alpha1.Destination:
			in.Destinations = append(in.Destinations, *o)
		case *networkingv1alpha1.VirtualMesh:
			in.VirtualMeshes = append(in.VirtualMeshes, *o)
		case *networkingv1alpha1.TrafficPolicy:
			in.TrafficPolicies = append(in.TrafficPolicies, *o)
		case *networkingv1alpha1.AccessPolicy:
			in.AccessPolicies = append(in.AccessPolicies, *o)
		case *networkingv1alpha1.VirtualDestination:
			in.VirtualDestinations = append(in.VirtualDestinations, *o)
		case *multiclusterv1alpha1.KubernetesCluster:
			in.Clusters = append(in.Clusters, *o)
		default:
			return fmt.Errorf("document %d: %s is not a translation input", i, u.GetKind())
		}
	}
}
