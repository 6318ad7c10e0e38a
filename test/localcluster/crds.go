package localcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/relaymesh/relaymesh/api/crds"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
)

// istioCRDFile is where the istio.io/api module keeps Istio's CRDs.
const istioCRDFile = "kubernetes/customresourcedefinitions.gen.yaml"

// loadCRDs reads Relaymesh's generated CRDs and Istio's.
func loadCRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var out []*apiextensionsv1.CustomResourceDefinition
	err := fs.WalkDir(crds.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(path) != ".yaml" {
			return err
		}
		b, err := fs.ReadFile(crds.FS, path)
		if err != nil {
			return err
		}
		list, err := decodeCRDs(b)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, list...)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("relaymesh CRDs: %w", err)
	}
	dir, err := istioAPIDir()
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(dir, istioCRDFile))
	if err != nil {
		return nil, fmt.Errorf("istio CRDs: %w", err)
	}
	list, err := decodeCRDs(b)
	if err != nil {
		return nil, fmt.Errorf("istio CRDs: %w", err)
	}
	if len(list) == 0 {
		return nil, fmt.Errorf("istio CRDs: none found in %s", filepath.Join(dir, istioCRDFile))
	}
	return append(out, list...), nil
}

// decodeCRDs splits a multi-document YAML stream into CRDs.
func decodeCRDs(b []byte) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var out []*apiextensionsv1.CustomResourceDefinition
	for {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := dec.Decode(crd); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if crd.Name == "" {
			continue // an empty document between separators
		}
		if crd.Kind != "CustomResourceDefinition" {
			return nil, fmt.Errorf("unexpected kind %q in CRD file", crd.Kind)
		}
		out = append(out, crd)
	}
}

// installCRDs creates the CRDs and waits until the API server serves them.
// seeded: the API server found them in etcd (seedCRDs), and only those it
// does not have are created (a create of one it has is refused only after
// the API server decoded and validated the whole CRD).
func installCRDs(ctx context.Context, cfg *rest.Config, list []*apiextensionsv1.CustomResourceDefinition, seeded bool) error {
	cs, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	api := cs.ApiextensionsV1().CustomResourceDefinitions()
	for _, crd := range list {
		if seeded {
			if _, err := api.Get(ctx, crd.Name, metav1.GetOptions{}); err == nil {
				continue
			}
		}
		if _, err := api.Create(ctx, crd.DeepCopy(), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create CRD %s: %w", crd.Name, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for _, crd := range list {
		for {
			got, err := api.Get(ctx, crd.Name, metav1.GetOptions{})
			if err == nil && established(got) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("CRD %s not established: %w", crd.Name, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}
