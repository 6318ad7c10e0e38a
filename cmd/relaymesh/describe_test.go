package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/relaymesh/relaymesh/translation/all"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// describeDir is the traffic-shift golden input plus policies.yaml.
const describeDir = "testdata/describe"

// TestDescribeOffline runs describe with -f on a directory: text output,
// and refusals of bad input with a clear message and exit code.
func TestDescribeOffline(t *testing.T) {
	empty := t.TempDir()
	bad := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(bad, "x.yaml"), []byte("apiVersion: v1\nkind: Service\nmetadata: {name: x}\n"), 0o600))
	unknownField := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(unknownField, "x.yaml"), []byte("apiVersion: networking.relaymesh.io/v1alpha1\nkind: TrafficPolicy\nmetadata: {name: x, namespace: apps}\nspec: {weights: 1}\n"), 0o600))
	refused := filepath.Join(t.TempDir(), "refused.yaml")
	require.NoError(t, os.WriteFile(refused, []byte("apiVersion: networking.relaymesh.io/v1alpha1\nkind: AccessPolicy\nmetadata: {name: everyone, namespace: relaymesh}\nspec: {}\n"), 0o600))
	tests := []struct {
		name     string
		args     []string
		code     int
		out, err []string
	}{
		{"destination", []string{"destination", "reviews-bookinfo-cluster-1", "-f", describeDir}, 0, []string{
			"Cluster:      cluster-1",
			"Hostnames:    reviews.bookinfo.svc.cluster.local, reviews.bookinfo.svc.cluster-1.global",
			"1  TrafficPolicy/bookinfo/reviews-timeout  Accepted",
			"2  TrafficPolicy/bookinfo/reviews-canary   Accepted",
			"1  AccessPolicy/bookinfo/reviews-from-productpage  Accepted",
			"relaymesh/bookinfo  Accepted  reviews.bookinfo.svc.cluster-1.global  cluster-2/istio-system/istiod",
			"cluster-1  DestinationRule      bookinfo/relaymesh-reviews            TrafficPolicy/bookinfo/reviews-canary,TrafficPolicy/bookinfo/reviews-timeout",
			"cluster-1  AuthorizationPolicy  bookinfo/relaymesh-reviews            AccessPolicy/bookinfo/reviews-from-productpage",
			"cluster-2  VirtualService       bookinfo/relaymesh-reviews-cluster-1  TrafficPolicy/bookinfo/reviews-timeout",
		}, nil},
		{"flags first", []string{"-f", describeDir, "destination", "details-bookinfo-cluster-1"}, 0, []string{
			"TrafficPolicies (translation order):  <none>", "Outputs:  <none>",
		}, nil},
		{"workload", []string{"workload", "productpage-v1-bookinfo-cluster-1-deployment", "-f", describeDir}, 0, []string{
			"Service account:  bookinfo-productpage",
			"3  TrafficPolicy/bookinfo/ratings-bad-regex  Invalid   spec.httpRequestMatchers[0].uri.regex",
			"1  AccessPolicy/bookinfo/reviews-from-productpage  Accepted",
		}, nil},
		{"policy", []string{"policy", "TrafficPolicy/bookinfo/reviews-canary", "-f", describeDir}, 0, []string{
			"State:                Accepted",
			"Destinations:         reviews-bookinfo-cluster-1",
			"Source workloads:     productpage-v1-bookinfo-cluster-1-deployment",
			"Outputs in cluster-1:",
			"VirtualService   bookinfo/relaymesh-reviews  networking.istio.io/v1",
		}, nil},
		{"invalid policy", []string{"policy", "tp/bookinfo/ratings-bad-regex", "-f", describeDir}, 0, []string{
			"State:                Invalid", `Error:                spec.httpRequestMatchers[0].uri.regex: regex "(unclosed" does not compile`, "Outputs:  <none>",
		}, nil},
		{"help", []string{"--help"}, 0, []string{"relaymesh describe destination|workload|policy NAME [flags]", "Examples:"}, nil},
		{"no arguments", nil, 2, nil, []string{"want destination|workload|policy and a NAME"}},
		{"three arguments", []string{"destination", "a", "b", "-f", describeDir}, 2, nil, []string{"want destination|workload|policy and a NAME"}},
		{"unknown kind", []string{"service", "reviews", "-f", describeDir}, 2, nil, []string{`unknown kind "service": want destination, workload or policy`}},
		{"unknown policy kind", []string{"policy", "gateway/bookinfo/x", "-f", describeDir}, 2, nil, []string{`unknown kind "gateway": want trafficpolicy`}},
		{"policy without namespace", []string{"policy", "trafficpolicy/reviews-canary", "-f", describeDir}, 2, nil, []string{"want KIND/NAMESPACE/NAME"}},
		{"bad output", []string{"destination", "x", "--output", "xml", "-f", describeDir}, 2, nil, []string{`-o "xml": want table, wide, json or yaml`}},
		{"yaml", []string{"policy", "TrafficPolicy/bookinfo/reviews-canary", "-f", describeDir, "-o", "yaml"}, 0, []string{"state: Accepted", "kind: TrafficPolicy"}, nil},
		{"unknown destination", []string{"destination", "reviews", "-f", describeDir}, 1, nil, []string{
			`destination "reviews" not found; did you mean reviews-bookinfo-cluster-1, reviews-bookinfo-cluster-2?`,
		}},
		{"unknown workload", []string{"workload", "nginx", "-f", describeDir}, 1, nil, []string{`workload "nginx" not found`}},
		{"unknown policy", []string{"policy", "accesspolicy/bookinfo/reviews", "-f", describeDir}, 1, nil, []string{
			`accesspolicy "bookinfo/reviews" not found; did you mean bookinfo/reviews-from-productpage?`,
		}},
		{"missing dir", []string{"destination", "x", "-f", filepath.Join(empty, "nope")}, 1, nil, []string{"-f: stat", "no such file or directory"}},
		{"empty dir", []string{"destination", "x", "-f", empty}, 1, nil, []string{"has no .yaml, .yml or .json files"}},
		{"foreign kind", []string{"destination", "x", "-f", bad}, 1, nil, []string{"x.yaml: document 1: v1 Service: skipped", `destination "x" not found`}},
		{"unknown field", []string{"destination", "x", "-f", unknownField}, 1, nil, []string{`error: ` + filepath.Join(unknownField, "x.yaml") + `: document 1: TrafficPolicy apps/x: spec.weights: unknown field "spec.weights"`}},
		{"refused policy", []string{"policy", "accesspolicy/relaymesh/everyone", "-f", describeDir, "-f", refused}, 0, []string{
			"State:             Invalid",
			"In force:          no — the server does not translate it",
			"Error:             refused by admission, so it is not translated: AccessPolicy relaymesh/everyone lets every source reach every destination",
			"Outputs:  <none>",
		}, nil},
		{"refused policy on a destination", []string{"destination", "reviews-bookinfo-cluster-1", "-f", describeDir, "-f", refused}, 0, []string{
			"2  AccessPolicy/relaymesh/everyone                 Invalid   refused by admission",
		}, nil},
		{"accepted policy is in force", []string{"policy", "TrafficPolicy/bookinfo/reviews-canary", "-f", describeDir}, 0, []string{"In force:             yes"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			assert.Equal(t, tt.code, run(context.Background(), append([]string{"describe"}, tt.args...), &out, &errOut), "stderr: %s", errOut.String())
			for _, s := range tt.out {
				assert.Contains(t, out.String(), s)
			}
			for _, s := range tt.err {
				assert.Contains(t, errOut.String(), s)
			}
		})
	}
}

// TestDescribeJSON checks the JSON form decodes into the descriptions.
func TestDescribeJSON(t *testing.T) {
	runJSON := func(t *testing.T, v any, args ...string) {
		t.Helper()
		var out, errOut bytes.Buffer
		require.Equal(t, 0, run(context.Background(), append(append([]string{"describe"}, args...), "-f", describeDir, "--output", "json"), &out, &errOut), errOut.String())
		dec := json.NewDecoder(&out)
		dec.DisallowUnknownFields()
		require.NoError(t, dec.Decode(v))
	}

	var d all.DestinationDescription
	runJSON(t, &d, "destination", "reviews-bookinfo-cluster-1")
	assert.Equal(t, "reviews-bookinfo-cluster-1", d.Name)
	require.Len(t, d.Traffic, 2)
	assert.Equal(t, "reviews-timeout", d.Traffic[0].Name)
	assert.Equal(t, "reviews-canary", d.Traffic[1].Name)
	require.NotNil(t, d.Traffic[1].Target)
	assert.Equal(t, "cluster-1/bookinfo/reviews", d.Traffic[1].Target.Target)
	assert.Len(t, d.Outputs, 4)

	var w all.WorkloadDescription
	runJSON(t, &w, "workload", "sleep-tools-cluster-2-deployment")
	assert.Equal(t, "sleep", w.ServiceAccount)
	assert.Len(t, w.Traffic, 2)
	assert.Empty(t, w.Access)

	var p all.PolicyDescription
	runJSON(t, &p, "policy", "ap/bookinfo/reviews-from-productpage")
	assert.Equal(t, "Accepted", p.State)
	assert.Equal(t, []string{"productpage-v1-bookinfo-cluster-1-deployment"}, p.Workloads)
	require.Len(t, p.Outputs, 1)
	require.Len(t, p.Outputs[0].Objects, 1)
	assert.Equal(t, "AuthorizationPolicy", p.Outputs[0].Objects[0].Kind)
}
