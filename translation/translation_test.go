package translation_test

import (
	"testing"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/translationtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	networkingv1 "istio.io/api/networking/v1"
)

func vs(host string) *networkingv1.VirtualService {
	return &networkingv1.VirtualService{Hosts: []string{host}, Http: []*networkingv1.HTTPRoute{{
		Route: []*networkingv1.HTTPRouteDestination{{Destination: &networkingv1.Destination{Host: host}}},
	}}}
}

func TestOutput(t *testing.T) {
	out := translation.NewOutput()
	p1 := translation.Parent{Kind: "TrafficPolicy", Namespace: "relaymesh", Name: "b"}
	p2 := translation.Parent{Kind: "TrafficPolicy", Namespace: "relaymesh", Name: "a"}
	require.NoError(t, out.Add("cluster-2", "networking.istio.io/v1", "VirtualService", "bookinfo", "reviews", vs("reviews"), p1))
	require.NoError(t, out.Add("cluster-2", "networking.istio.io/v1", "VirtualService", "bookinfo", "reviews", vs("reviews"), p2))
	require.NoError(t, out.Add("cluster-1", "networking.istio.io/v1", "VirtualService", "bookinfo", "reviews", vs("reviews"), p1))
	err := out.Add("cluster-1", "networking.istio.io/v1", "VirtualService", "bookinfo", "reviews", vs("ratings"), p2)
	require.Error(t, err, "the same object with another spec is a conflict")
	assert.Contains(t, err.Error(), "produced twice with different specs")

	objs := out.Objects()
	require.Len(t, objs, 2)
	assert.Equal(t, "cluster-1", objs[0].Cluster, "sorted by cluster")
	assert.Equal(t, "TrafficPolicy/relaymesh/a,TrafficPolicy/relaymesh/b", objs[1].Object.GetAnnotations()[outputs.ParentsAnnotation], "parents merged and sorted")
	assert.Equal(t, []string{"cluster-1", "cluster-2"}, out.Clusters())
	spec := objs[0].Object.Object["spec"].(map[string]any)
	assert.Equal(t, []any{"reviews"}, spec["hosts"], "protobuf JSON, as Istio's CRDs expect")
}

// The golden harness's checks must be able to fail: a VirtualService with an
// empty host is refused by istioctl, and by the real apiserver's schema.
func TestHarnessChecks(t *testing.T) {
	good := translation.NewOutput()
	require.NoError(t, good.Add("cluster-1", "networking.istio.io/v1", "VirtualService", "bookinfo", "reviews", vs("reviews")))
	translationtest.CheckWithIstioctl(t, good)

	translationtest.DryRun(t, translationtest.Cluster(t), good)

	bad := translation.NewOutput()
	require.NoError(t, bad.Add("cluster-1", "networking.istio.io/v1", "VirtualService", "bookinfo", "bad", vs("")))
	ft := &fakeT{TB: t}
	func() {
		defer func() { _ = recover() }()
		translationtest.CheckWithIstioctl(ft, bad)
	}()
	assert.True(t, ft.failed, "istioctl must reject an empty host")
}

// fakeT records a failure instead of failing the real test.
type fakeT struct {
	testing.TB
	failed bool
}

func (f *fakeT) Errorf(string, ...any) { f.failed = true }
func (f *fakeT) FailNow()              { f.failed = true; panic("FailNow") }
func (f *fakeT) Helper()               {}

// Two DestinationRules for one host merge whichever comes first; a field
// both set differently, a subset defined twice differently, or another kind
// with different specs is an error naming the field.
func TestMergeSpecs(t *testing.T) {
	fed := map[string]any{"host": "h", "trafficPolicy": map[string]any{"tls": map[string]any{"mode": "ISTIO_MUTUAL"}}}
	pol := map[string]any{"host": "h", "trafficPolicy": map[string]any{"outlierDetection": map[string]any{"interval": "5s"}},
		"subsets": []any{map[string]any{"name": "v1"}, map[string]any{"name": "v2"}}}
	ab, err := translation.MergeSpecs("DestinationRule", fed, pol)
	require.NoError(t, err)
	ba, err := translation.MergeSpecs("DestinationRule", pol, fed)
	require.NoError(t, err)
	assert.Equal(t, ab, ba, "the merge does not depend on the order")
	assert.Equal(t, map[string]any{"host": "h",
		"trafficPolicy": map[string]any{"tls": map[string]any{"mode": "ISTIO_MUTUAL"}, "outlierDetection": map[string]any{"interval": "5s"}},
		"subsets":       []any{map[string]any{"name": "v1"}, map[string]any{"name": "v2"}}}, ab)

	simple := map[string]any{"host": "h", "trafficPolicy": map[string]any{"tls": map[string]any{"mode": "SIMPLE"}}}
	_, err = translation.MergeSpecs("DestinationRule", fed, simple)
	require.EqualError(t, err, "trafficPolicy.tls is set differently by two parents")
	_, err = translation.MergeSpecs("DestinationRule", fed, map[string]any{"host": "other"})
	require.EqualError(t, err, "host is set differently by two parents")
	_, err = translation.MergeSpecs("DestinationRule",
		map[string]any{"subsets": []any{map[string]any{"name": "v1", "labels": map[string]any{"version": "v1"}}}},
		map[string]any{"subsets": []any{map[string]any{"name": "v1", "labels": map[string]any{"version": "v2"}}}})
	require.EqualError(t, err, `subset "v1" is defined differently by two parents`)
	_, err = translation.MergeSpecs("ServiceEntry", fed, pol)
	require.EqualError(t, err, "produced twice with different specs")
	same, err := translation.MergeSpecs("ServiceEntry", fed, fed)
	require.NoError(t, err)
	assert.Equal(t, fed, same)
}

// TestFailTargetTurnsTheTargetsResultFailed: a result recorded Accepted
// becomes Failed with the error (one result per target, the error once);
// a target without a result gets a Failed one.
func TestFailTargetTurnsTheTargetsResultFailed(t *testing.T) {
	r := translation.NewReport()
	k := translation.ObjectKey{Kind: "TrafficPolicy", Namespace: "shop", Name: "p"}
	r.Accept(k, 1)
	r.Target(k, common.TargetStatus{Target: "cluster-1/shop/web", State: common.StateAccepted, Errors: []string{"a note"}})
	r.FailTarget(k, "cluster-1/shop/web", "cannot write")
	r.FailTarget(k, "cluster-1/shop/web", "cannot write")
	r.FailTarget(k, "cluster-1/shop/db", "cannot write either")
	_, targets, _ := r.Status(k)
	assert.Equal(t, []common.TargetStatus{
		{Target: "cluster-1/shop/db", State: common.StateFailed, Errors: []string{"cannot write either"}},
		{Target: "cluster-1/shop/web", State: common.StateFailed, Errors: []string{"a note", "cannot write"}},
	}, targets)
}
