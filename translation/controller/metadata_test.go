package controller_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/translation/controller"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// Admission rules read an object's annotations and labels (the default
// rules: relaymesh.io/allow-all), which its generation does not cover: a
// change to them alone is judged again at once, both ways — an allow-all
// AccessPolicy whose opt-in is removed leaves translation, and is back in
// it when the opt-in returns. Before, such a change waited for the next
// unrelated translation (in a quiet fleet, the Namespaces' informer resync:
// up to 10 minutes).
func TestAMetadataOnlyChangeIsJudgedAgain(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns = "relaymesh"
	_, _, admin := localcluster.Management(t, ns)
	apGVR := networkingv1alpha1.AccessPolicies
	_, err := admin.Resource(apGVR).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": networkingv1alpha1.GroupVersion.String(), "kind": "AccessPolicy",
		"metadata": map[string]any{"name": "everyone", "annotations": map[string]any{"relaymesh.io/allow-all": "true"}},
		"spec":     map[string]any{}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = controller.Start(ctx, controller.Config{Client: admin, Namespace: ns, Outputs: server.NewOutputs(time.Now()),
		Clusters: func() []string { return []string{"c1"} }, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Admission: defaultAdmission(t)})
	require.NoError(t, err)

	state := func() (string, string) {
		o, err := admin.Resource(apGVR).Namespace(ns).Get(ctx, "everyone", metav1.GetOptions{})
		require.NoError(t, err)
		s, _, _ := unstructured.NestedString(o.Object, "status", "state")
		errs, _, _ := unstructured.NestedStringSlice(o.Object, "status", "errors")
		return s, strings.Join(errs, "; ")
	}
	waitState := func(why string, want func(state, errs string) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		s, e := state()
		for !want(s, e) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			s, e = state()
		}
		require.True(t, want(s, e), "%s; after 10 s the status says %q %q", why, s, e)
	}
	refused := func(s, e string) bool {
		return s == "Invalid" && strings.Contains(e, "lets every source reach every destination")
	}
	waitState("with the opt-in, admitted", func(s, e string) bool { return s != "" && !refused(s, e) })

	setOptIn := func(v any) {
		t.Helper()
		patch := `{"metadata":{"annotations":{"relaymesh.io/allow-all":null}}}`
		if v != nil {
			patch = `{"metadata":{"annotations":{"relaymesh.io/allow-all":"true"}}}`
		}
		o, err := admin.Resource(apGVR).Namespace(ns).Patch(ctx, "everyone", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		require.NoError(t, err)
		require.Equal(t, int64(1), o.GetGeneration(), "a metadata change leaves the generation")
	}
	setOptIn(nil)
	waitState("the opt-in removed: refused", refused)
	setOptIn("true")
	waitState("the opt-in back: admitted", func(s, e string) bool { return s != "" && !refused(s, e) })
}
