package server_test

import (
	"io/fs"
	"sync"
	"testing"

	"github.com/relaymesh/relaymesh/api/crds"
	"github.com/stretchr/testify/require"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	metavalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

// crdValidators are the OpenAPI validators of Relaymesh's CRDs by kind,
// loaded once from the embedded manifests.
var crdValidators = sync.OnceValues(func() (map[string]validation.SchemaCreateValidator, error) {
	out := map[string]validation.SchemaCreateValidator{}
	err := fs.WalkDir(crds.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(crds.FS, path)
		if err != nil {
			return err
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(b, &crd); err != nil {
			return err
		}
		var internal apiextensions.JSONSchemaProps
		if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(crd.Spec.Versions[0].Schema.OpenAPIV3Schema, &internal, nil); err != nil {
			return err
		}
		v, _, err := validation.NewSchemaValidator(&internal)
		if err != nil {
			return err
		}
		out[crd.Spec.Names.Kind] = v
		return nil
	})
	return out, err
})

// schemaErrors validates obj as the apiserver would before storing it: its
// metadata (name, labels, annotations) and its CRD's OpenAPI schema.
func schemaErrors(t testing.TB, obj *unstructured.Unstructured) field.ErrorList {
	t.Helper()
	validators, err := crdValidators()
	require.NoError(t, err)
	v, ok := validators[obj.GetKind()]
	require.True(t, ok, "no CRD for kind %s", obj.GetKind())
	errs := validation.ValidateCustomResource(nil, obj.Object, v)
	meta := &metav1.ObjectMeta{Name: obj.GetName(), Namespace: obj.GetNamespace(), Labels: obj.GetLabels(), Annotations: obj.GetAnnotations()}
	return append(errs, metavalidation.ValidateObjectMeta(meta, true, metavalidation.NameIsDNSSubdomain, field.NewPath("metadata"))...)
}
