// Package translationtest runs translation golden tests: an input.yaml of
// discovered and user objects goes in; the output (per-cluster Istio
// objects) and the status report are compared with output.yaml and
// status.yaml (rewritten with `go test -update`); every output object is then
// checked by `istioctl validate`, `istioctl analyze --use-kube=false`, and a
// server-side dry-run apply on a real kube-apiserver with Istio's CRDs. It
// is imported only from _test.go files.
package translationtest

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/test/istioctl"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

// Update rewrites golden files instead of comparing.
var Update = flag.Bool("update", false, "rewrite golden output.yaml and status.yaml files")

// LoadInput reads dir/input.yaml, a multi-document YAML of Mesh, Workload,
// Destination, VirtualMesh, TrafficPolicy, AccessPolicy and
// VirtualDestination objects, strictly (unknown fields fail the test).
func LoadInput(t testing.TB, dir string) *translation.Input {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "input.yaml"))
	require.NoError(t, err)
	in := &translation.Input{}
	require.NoError(t, in.Decode(b), "%s/input.yaml", dir)
	return in
}

// RenderOutput is the golden form of an output: one YAML document per
// object, sorted, each preceded by a comment naming its cluster.
func RenderOutput(t testing.TB, out *translation.Output) []byte {
	t.Helper()
	var b bytes.Buffer
	for i, o := range out.Objects() {
		if i > 0 {
			b.WriteString("---\n")
		}
		y, err := yaml.Marshal(o.Object.Object)
		require.NoError(t, err)
		fmt.Fprintf(&b, "# cluster: %s\n%s", o.Cluster, y)
	}
	return b.Bytes()
}

// OutputSet is cluster's part of out as the server sends it to that
// cluster's agent: each object's manifest and parents.
func OutputSet(t testing.TB, out *translation.Output, cluster string) []*relaypb.OutputObject {
	t.Helper()
	var set []*relaypb.OutputObject
	for _, o := range out.Objects() {
		if o.Cluster != cluster {
			continue
		}
		b, err := json.Marshal(o.Object.Object)
		require.NoError(t, err)
		var parents []string
		for _, p := range o.Parents {
			parents = append(parents, p.String())
		}
		set = append(set, &relaypb.OutputObject{Manifest: b, Parents: parents})
	}
	return set
}

// RenderReport is the golden form of a report.
func RenderReport(t testing.TB, r *translation.Report) []byte {
	t.Helper()
	var list []map[string]any
	for _, k := range r.Keys() {
		st, targets, _ := r.Status(k)
		entry := map[string]any{"kind": k.Kind, "namespace": k.Namespace, "name": k.Name, "state": st.State, "observedGeneration": st.ObservedGeneration}
		if len(st.Errors) > 0 {
			entry["errors"] = st.Errors
		}
		if len(st.Warnings) > 0 {
			entry["warnings"] = st.Warnings
		}
		if len(targets) > 0 {
			entry["targets"] = targets
		}
		if ws := r.SourceWorkloads(k); len(ws) > 0 {
			entry["workloads"] = ws
		}
		list = append(list, entry)
	}
	y, err := yaml.Marshal(list)
	require.NoError(t, err)
	return y
}

// Golden compares (or with -update writes) dir/output.yaml and dir/status.yaml.
func Golden(t testing.TB, dir string, out *translation.Output, r *translation.Report) {
	t.Helper()
	for name, got := range map[string][]byte{"output.yaml": RenderOutput(t, out), "status.yaml": RenderReport(t, r)} {
		path := filepath.Join(dir, name)
		if *Update {
			require.NoError(t, os.WriteFile(path, got, 0o644))
			continue
		}
		want, err := os.ReadFile(path)
		require.NoError(t, err, "missing golden file; run go test -update")
		require.Equal(t, string(want), string(got), "%s differs; if the change is intended, run go test -update and review the diff", path)
	}
}

// CheckWithIstioctl writes each cluster's output to a file and runs
// `istioctl validate` and `istioctl analyze --use-kube=false` on it.
func CheckWithIstioctl(t testing.TB, out *translation.Output) {
	t.Helper()
	localcluster.SkipIfShort(t)
	dir := t.TempDir()
	byCluster := map[string]*translation.Output{}
	for _, o := range out.Objects() {
		if byCluster[o.Cluster] == nil {
			byCluster[o.Cluster] = translation.NewOutput()
		}
		byCluster[o.Cluster].Put(o)
	}
	for cluster, co := range byCluster {
		path := filepath.Join(dir, cluster+".yaml")
		require.NoError(t, os.WriteFile(path, RenderOutput(t, co), 0o600))
		require.NoError(t, istioctl.Validate(context.Background(), path), "cluster %s", cluster)
		require.NoError(t, istioctl.Analyze(context.Background(), path), "cluster %s", cluster)
	}
}

// DryRun server-side-applies every output object in dry-run mode against a
// real kube-apiserver with Istio's CRDs, so the schemas and CEL rules judge
// them. Namespaces the objects need are created for real.
func DryRun(t testing.TB, c *localcluster.Cluster, out *translation.Output) {
	t.Helper()
	localcluster.SkipIfShort(t)
	ctx := context.Background()
	cs, err := c.Clientset()
	require.NoError(t, err)
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	require.NoError(t, err)
	for _, o := range out.Objects() {
		if o.Object.GroupVersionKind().Group == GatewayAPIGroup {
			ensureGatewayAPI(t, c)
		}
		ns := o.Object.GetNamespace()
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			require.NoError(t, err)
		}
		gvk := o.Object.GroupVersionKind()
		gvr := schema.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: Resource(gvk.Kind)}
		body, err := o.Object.MarshalJSON()
		require.NoError(t, err)
		_, err = dyn.Resource(gvr).Namespace(ns).Patch(ctx, o.Object.GetName(), types.ApplyPatchType, body,
			metav1.PatchOptions{FieldManager: "translation-test", DryRun: []string{metav1.DryRunAll}, Force: new(true), FieldValidation: metav1.FieldValidationStrict})
		require.NoError(t, err, "dry run of %s %s/%s for %s", gvk.Kind, ns, o.Object.GetName(), o.Cluster)
	}
}

// Admitted checks out the way a cluster admits it, in a subtest of its
// own: istioctl validate, then a server-side dry run on the package's
// shared kube-apiserver (Cluster). Under -short (make test-unit) only that
// subtest is skipped, so a golden comparison before it still runs.
func Admitted(t *testing.T, out *translation.Output) {
	t.Helper()
	t.Run("istioctl and apiserver dry run", func(t *testing.T) {
		localcluster.SkipIfShort(t)
		CheckWithIstioctl(t, out)
		DryRun(t, Cluster(t), out)
	})
}

// Resource is the plural resource of an Istio kind.
func Resource(kind string) string {
	l := strings.ToLower(kind)
	switch l {
	case "serviceentry":
		return "serviceentries"
	case "authorizationpolicy":
		return "authorizationpolicies"
	case "workloadentry":
		return "workloadentries"
	}
	return l + "s"
}
