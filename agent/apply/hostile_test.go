package apply_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/relaymesh/relaymesh/agent/apply"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestHostileManifests sends one set full of objects a compromised or buggy
// management server might send. Each is refused with a clear error, none
// reaches the cluster, and the one good object is still applied.
func TestHostileManifests(t *testing.T) {
	f := newFixture(t)
	a := f.applier(t, nil)
	ctx := context.Background()
	good := virtualService("app-a", "good", "good.example.com")
	vs := func(name string) map[string]any { return virtualService("app-a", name, name+".example.com") }
	obj := func(apiVersion, kind, ns, name string, extra map[string]any) map[string]any {
		md := map[string]any{"name": name}
		if ns != "" {
			md["namespace"] = ns
		}
		o := map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": md}
		for k, v := range extra {
			o[k] = v
		}
		return o
	}
	schemaInvalid := vs("schema-invalid")
	schemaInvalid["spec"].(map[string]any)["hosts"] = "not-a-list"
	unknownField := vs("unknown-field")
	unknownField["spec"].(map[string]any)["mirrorEverythingTo"] = "attacker.example.com"
	withStatus := vs("with-status")
	withStatus["status"] = map[string]any{}
	oversized := withMeta(vs("oversized"), "annotations", map[string]any{"pad": strings.Repeat("x", apply.DefaultMaxObjectBytes)})
	otherVersion := vs("other-version")
	otherVersion["apiVersion"] = "networking.istio.io/v1beta1"

	// absent checks that nothing of a case reached the cluster.
	type absent struct {
		gvr       schema.GroupVersionResource
		namespace string // "" for cluster-scoped or every namespace
		name      string
	}
	secrets := schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	pods := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	namespaces := schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	crbs := schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"}
	cases := []struct {
		name     string
		manifest []byte // or obj
		obj      map[string]any
		parents  []string
		wantErr  string
		absent   absent
	}{
		{name: "cluster role binding", obj: obj("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "app-a", "pwn", map[string]any{
			"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
			"subjects": []any{map[string]any{"kind": "ServiceAccount", "name": "default", "namespace": "app-a"}},
		}), wantErr: "kind ClusterRoleBinding (rbac.authorization.k8s.io/v1) is not managed by the agent", absent: absent{crbs, "", "pwn"}},
		{name: "secret", obj: obj("v1", "Secret", "app-a", "stolen", map[string]any{"stringData": map[string]any{"k": "v"}}),
			wantErr: "kind Secret (v1) is not managed by the agent", absent: absent{secrets, "app-a", "stolen"}},
		{name: "pod", obj: obj("v1", "Pod", "app-a", "miner", map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "c", "image": "evil"}}}}),
			wantErr: "kind Pod (v1) is not managed by the agent", absent: absent{pods, "app-a", "miner"}},
		{name: "cluster-scoped object", obj: obj("v1", "Namespace", "", "evil", nil),
			wantErr: "kind Namespace (v1) is not managed by the agent", absent: absent{namespaces, "", "evil"}},
		{name: "other version of an allowed kind", obj: otherVersion,
			wantErr: "kind VirtualService (networking.istio.io/v1beta1) is not managed by the agent", absent: absent{virtualServices, "app-a", "other-version"}},
		{name: "missing namespace", obj: virtualService("", "no-namespace", "x.example.com"),
			wantErr: "metadata.namespace: required string", absent: absent{virtualServices, "", "no-namespace"}},
		{name: "owner references", obj: withMeta(vs("owner-refs"), "ownerReferences", []any{map[string]any{"apiVersion": "v1", "kind": "Namespace", "name": "app-a", "uid": "1"}}),
			wantErr: "metadata.ownerReferences is not allowed", absent: absent{virtualServices, "app-a", "owner-refs"}},
		{name: "finalizers", obj: withMeta(vs("finalizers"), "finalizers", []any{"example.com/never"}),
			wantErr: "metadata.finalizers is not allowed", absent: absent{virtualServices, "app-a", "finalizers"}},
		{name: "generate name", obj: withMeta(vs("generated"), "generateName", "generated-"),
			wantErr: "metadata.generateName is not allowed", absent: absent{virtualServices, "app-a", "generated"}},
		{name: "uid and resourceVersion", obj: withMeta(vs("pinned"), "uid", "1", "resourceVersion", "1"),
			wantErr: "metadata.resourceVersion is not allowed; metadata.uid is not allowed", absent: absent{virtualServices, "app-a", "pinned"}},
		{name: "invalid name", obj: vs("Not_A_Name"), wantErr: "metadata.name: a lowercase RFC 1123 subdomain", absent: absent{virtualServices, "app-a", "Not_A_Name"}},
		{name: "label that is not a string", obj: withMeta(vs("bad-label"), "labels", map[string]any{"n": int64(1)}),
			wantErr: `metadata.labels["n"]: must be a string`, absent: absent{virtualServices, "app-a", "bad-label"}},
		{name: "status", obj: withStatus, wantErr: "status is not allowed", absent: absent{virtualServices, "app-a", "with-status"}},
		{name: "parent with a comma", obj: vs("bad-parent"), parents: []string{"TrafficPolicy/app-a/a,b"},
			wantErr: "parents[0]: name: a lowercase RFC 1123 subdomain", absent: absent{virtualServices, "app-a", "bad-parent"}},
		{name: "invalid JSON", manifest: []byte(`{"apiVersion": "networking.istio.io/v1", "kind": "VirtualService", "metadata": {"name": "broken"`),
			wantErr: "manifest is not valid JSON", absent: absent{virtualServices, "app-a", "broken"}},
		{name: "not an object", manifest: []byte(`["networking.istio.io/v1", "VirtualService"]`), wantErr: "manifest is not a JSON object"},
		{name: "oversized", obj: oversized, wantErr: "bytes, at most 262144", absent: absent{virtualServices, "app-a", "oversized"}},
		{name: "duplicate", obj: good, wantErr: "duplicate of object 0 (same kind, namespace and name)"},
		{name: "schema-invalid", obj: schemaInvalid, wantErr: `spec.hosts: Invalid value: "string": spec.hosts in body must be of type array`, absent: absent{virtualServices, "app-a", "schema-invalid"}},
		{name: "unknown field", obj: unknownField, wantErr: `unknown field "spec.mirrorEverythingTo"`, absent: absent{virtualServices, "app-a", "unknown-field"}},
		{name: "namespace that does not exist", obj: virtualService("nowhere", "lost", "lost.example.com"),
			wantErr: `namespaces "nowhere" not found`, absent: absent{virtualServices, "nowhere", "lost"}},
	}
	objs := []*relaypb.OutputObject{output(t, good, "TrafficPolicy/app-a/tp")}
	for _, c := range cases {
		if c.manifest == nil {
			objs = append(objs, output(t, c.obj, c.parents...))
			continue
		}
		objs = append(objs, &relaypb.OutputObject{Manifest: c.manifest, Parents: c.parents})
	}
	results, err := a.Apply(ctx, &relaypb.OutputSet{Version: 7, Objects: objs})
	require.NoError(t, err)
	require.Len(t, results, len(objs), "one result per object, nothing pruned")
	// Refused manifests name their index; objects the API server rejected
	// are found by name.
	byIndex := map[int]*relaypb.ObjectResult{}
	for _, r := range results {
		var i int
		if _, err := fmt.Sscanf(r.GetError(), "object %d:", &i); err == nil {
			byIndex[i] = r
		}
	}
	named := byName(results)

	var goodOutcomes []string
	for _, r := range results {
		if key(r.GetKind(), r.GetNamespace(), r.GetName()) == key("VirtualService", "app-a", "good") {
			goodOutcomes = append(goodOutcomes, r.GetOutcome())
		}
	}
	assert.Equal(t, []string{"applied", "error"}, goodOutcomes, "the good object is applied, its duplicate refused")
	assert.NotNil(t, f.get(t, virtualServices, "app-a", "good"))
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := byIndex[i+1]
			if r == nil {
				r = named[key(c.obj["kind"].(string), c.absent.namespace, c.absent.name)]
			}
			require.NotNil(t, r, "a result for object %d", i+1)
			assert.Equal(t, "error", r.GetOutcome())
			assert.Contains(t, r.GetError(), c.wantErr)
			if c.absent.name == "" {
				return
			}
			res := f.dyn.Resource(c.absent.gvr)
			if c.absent.namespace == "" {
				list, err := res.List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + c.absent.name})
				require.NoError(t, err)
				assert.Empty(t, list.Items)
				return
			}
			_, err := res.Namespace(c.absent.namespace).Get(ctx, c.absent.name, metav1.GetOptions{})
			assert.True(t, apierrors.IsNotFound(err), "%s %s/%s must not exist: %v", c.absent.gvr.Resource, c.absent.namespace, c.absent.name, err)
		})
	}
	assert.NotContains(t, f.logs.String(), "cluster-admin", "manifests never reach the log")

	t.Run("a cluster-scoped kind is refused even when allowlisted", func(t *testing.T) {
		clusterRoles := schema.GroupVersionKind{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRole"}
		wide := f.applier(t, func(c *apply.Config) {
			c.Kinds = append([]schema.GroupVersionKind{clusterRoles}, apply.DefaultKinds...)
		})
		results, err := wide.Apply(ctx, &relaypb.OutputSet{Objects: []*relaypb.OutputObject{
			output(t, obj("rbac.authorization.k8s.io/v1", "ClusterRole", "app-a", "escalate", map[string]any{
				"rules": []any{map[string]any{"apiGroups": []any{"*"}, "resources": []any{"*"}, "verbs": []any{"*"}}},
			})),
			output(t, good, "TrafficPolicy/app-a/tp"),
		}})
		require.NoError(t, err)
		got := byName(results)
		assert.Equal(t, "unchanged", got[key("VirtualService", "app-a", "good")].GetOutcome())
		assert.Contains(t, got[key("ClusterRole", "app-a", "escalate")].GetError(), "kind ClusterRole (rbac.authorization.k8s.io/v1) is cluster-scoped; the agent manages namespaced kinds only")
		assert.Contains(t, got[key("ClusterRole", "", "")].GetError(), "owned objects of this kind were not pruned")
		_, err = f.cs.RbacV1().ClusterRoles().Get(ctx, "escalate", metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err))
	})
}
