package apply

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

func testRules() rules {
	r := rules{kinds: map[schema.GroupVersionKind]bool{}, groupKinds: map[schema.GroupKind]bool{}, maxBytes: 1024, owner: "me"}
	for _, k := range DefaultKinds {
		r.kinds[k] = true
		r.groupKinds[k.GroupKind()] = true
	}
	return r
}

func TestCheckManifest(t *testing.T) {
	const vs = `{"apiVersion":"networking.istio.io/v1","kind":"VirtualService","metadata":{"name":"a","namespace":"ns"%s},"spec":{"hosts":["a"]}%s}`
	ok := func(meta, top string) string {
		return strings.Replace(strings.Replace(vs, "%s", meta, 1), "%s", top, 1)
	}
	tests := []struct {
		name     string
		manifest string
		parents  []string
		state    identityState
		problems []string
	}{
		{name: "valid", manifest: ok("", ""), state: identityKnown},
		{name: "null creationTimestamp", manifest: ok(`,"creationTimestamp":null`, ""), state: identityKnown},
		{name: "set creationTimestamp", manifest: ok(`,"creationTimestamp":"2020-01-01T00:00:00Z"`, ""), state: identityKnown,
			problems: []string{"metadata.creationTimestamp is not allowed"}},
		{name: "every forbidden metadata field, sorted", manifest: ok(`,"uid":"u","finalizers":["f"],"ownerReferences":[],"generateName":"g","managedFields":[],"deletionTimestamp":null`, ""), state: identityKnown,
			problems: []string{"metadata.deletionTimestamp is not allowed", "metadata.finalizers is not allowed", "metadata.generateName is not allowed",
				"metadata.managedFields is not allowed", "metadata.ownerReferences is not allowed", "metadata.uid is not allowed"}},
		{name: "annotations not an object", manifest: ok(`,"annotations":"x"`, ""), state: identityKnown, problems: []string{"metadata.annotations: must be an object of strings"}},
		{name: "status", manifest: ok("", `,"status":{}`), state: identityKnown, problems: []string{"status is not allowed (the agent applies desired state only)"}},
		{name: "kind not allowed", manifest: `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"a","namespace":"ns"}}`, state: identityIrrelevant,
			problems: []string{"kind Secret (v1) is not managed by the agent"}},
		{name: "bad apiVersion", manifest: `{"apiVersion":"a/b/c","kind":"VirtualService","metadata":{"name":"a","namespace":"ns"}}`, state: identityIrrelevant,
			problems: []string{`apiVersion "a/b/c" is not a group/version`}},
		{name: "kind not a string", manifest: `{"apiVersion":"v1","kind":1,"metadata":{"name":"a","namespace":"ns"}}`, state: identityUnknown,
			problems: []string{"kind: required string"}},
		{name: "allowed kind without name", manifest: `{"apiVersion":"networking.istio.io/v1","kind":"Gateway","metadata":{"namespace":"ns"}}`, state: identityUnknown,
			problems: []string{"metadata.name: required string"}},
		{name: "other version of an allowed kind still names it", manifest: `{"apiVersion":"networking.istio.io/v1alpha3","kind":"Gateway","metadata":{"name":"a","namespace":"ns"}}`, state: identityKnown,
			problems: []string{"kind Gateway (networking.istio.io/v1alpha3) is not managed by the agent"}},
		{name: "namespace not a label", manifest: `{"apiVersion":"networking.istio.io/v1","kind":"Gateway","metadata":{"name":"a","namespace":"a.b"}}`, state: identityKnown,
			problems: []string{"metadata.namespace: must not contain dots"}},
		{name: "null", manifest: `null`, state: identityUnknown, problems: []string{"manifest is not a JSON object"}},
		{name: "trailing data", manifest: ok("", "") + `{}`, state: identityUnknown, problems: []string{"manifest is not valid JSON"}},
		{name: "too large", manifest: ok(`,"labels":{"x":"`+strings.Repeat("y", 1024)+`"}`, ""), state: identityUnknown, problems: []string{"manifest is 11"}},
		{name: "parents", manifest: ok("", ""), parents: []string{"A/ns/n", "a/b", "1A/ns/n", "A/NS/n", "A/ns/N"}, state: identityKnown,
			problems: []string{"parents[1]: must be <Kind>/<namespace>/<name>", "parents[2]: kind must be alphanumeric", "parents[3]: namespace:", "and 1 more bad parents"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := checkManifest(testRules(), []byte(tt.manifest), tt.parents)
			assert.Equal(t, tt.state, m.state)
			require.Len(t, m.problems, len(tt.problems), "%q", m.problems)
			for i, p := range tt.problems {
				assert.Contains(t, m.problems[i], p)
			}
			if len(tt.problems) > 0 {
				assert.Nil(t, m.obj)
				return
			}
			require.NotNil(t, m.obj)
			assert.Equal(t, map[string]string{outputs.OwnerLabel: "me"}, m.obj.GetLabels())
			assert.Equal(t, objectKey{group: "networking.istio.io", kind: "VirtualService", namespace: "ns", name: "a"}, m.key)
		})
	}
}

func TestCheckManifestRewritesMetadata(t *testing.T) {
	raw := `{"apiVersion":"networking.istio.io/v1","kind":"VirtualService",
		"metadata":{"name":"a","namespace":"ns","creationTimestamp":null,
			"labels":{"app":"x","relaymesh.io/owner":"someone-else"},
			"annotations":{"relaymesh.io/parents":"Forged/ns/x","note":"kept"}},
		"spec":{"hosts":["a"],"big":12345678901234567}}`
	m := checkManifest(testRules(), []byte(raw), []string{"B/ns/b", "A/ns/a", "B/ns/b"})
	require.Empty(t, m.problems)
	got, err := json.Marshal(m.obj.Object)
	require.NoError(t, err)
	assert.JSONEq(t, `{"apiVersion":"networking.istio.io/v1","kind":"VirtualService",
		"metadata":{"name":"a","namespace":"ns",
			"labels":{"app":"x","relaymesh.io/owner":"me"},
			"annotations":{"relaymesh.io/parents":"A/ns/a,B/ns/b","note":"kept"}},
		"spec":{"hosts":["a"],"big":12345678901234567}}`, string(got), "owner and parents are the agent's; integers keep their precision")
}

func TestConfigValidate(t *testing.T) {
	dyn := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())
	mapper := meta.NewDefaultRESTMapper(nil)
	valid := Config{Dynamic: dyn, Mapper: mapper, Owner: "relaymesh-agent"}.Default()
	tests := []struct {
		name    string
		edit    func(*Config)
		wantErr []string
	}{
		{name: "defaults are valid", edit: func(*Config) {}},
		{name: "missing clients and owner", edit: func(c *Config) { c.Dynamic, c.Mapper, c.Owner = nil, nil, "" },
			wantErr: []string{"dynamic: required", "mapper: required", "owner: required"}},
		{name: "owner not a label value", edit: func(c *Config) { c.Owner = "relaymesh agent" }, wantErr: []string{`owner: "relaymesh agent" is not a label value`}},
		{name: "no kinds", edit: func(c *Config) { c.Kinds = nil }, wantErr: []string{"kinds: at least one kind is required"}},
		{name: "two versions of one kind", edit: func(c *Config) {
			c.Kinds = append(c.Kinds, schema.GroupVersionKind{Group: "networking.istio.io", Version: "v1beta1", Kind: "VirtualService"})
		}, wantErr: []string{"kinds[6]: VirtualService.networking.istio.io is listed twice (kinds[0])"}},
		{name: "kind without version", edit: func(c *Config) { c.Kinds = []schema.GroupVersionKind{{Kind: "X"}} }, wantErr: []string{"kinds[0]: version and kind are required"}},
		{name: "limits", edit: func(c *Config) { c.MaxObjectBytes, c.MaxObjects = -1, 1<<30 },
			wantErr: []string{"maxObjectBytes: -1 is outside", "maxObjects: 1073741824 is outside"}},
		{name: "no logger", edit: func(c *Config) { c.Logger = nil }, wantErr: []string{"logger: required"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid
			c.Kinds = append([]schema.GroupVersionKind(nil), valid.Kinds...)
			tt.edit(&c)
			err := c.Validate()
			if len(tt.wantErr) == 0 {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, w := range tt.wantErr {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
	_, err := New(Config{Dynamic: dyn, Mapper: mapper})
	assert.ErrorContains(t, err, "apply: invalid config: owner: required")
}

// FuzzCheckManifest checks that no manifest makes the checker panic, and
// that whatever it accepts is an allowed, namespaced, owner-labelled object
// with no lifecycle metadata.
func FuzzCheckManifest(f *testing.F) {
	f.Add([]byte(`{"apiVersion":"networking.istio.io/v1","kind":"VirtualService","metadata":{"name":"a","namespace":"ns","labels":{"relaymesh.io/owner":"x"}},"spec":{}}`), "A/ns/a")
	f.Add([]byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"a","namespace":"ns","finalizers":["x"]}}`), "")
	f.Add([]byte(`{"apiVersion":"networking.istio.io/v1","kind":"Gateway","metadata":{"name":"a","namespace":"ns","ownerReferences":[]},"status":{}}`), "x,y")
	f.Add([]byte(`[1,2,3]`), "A/b/c")
	r := testRules()
	f.Fuzz(func(t *testing.T, raw []byte, parent string) {
		m := checkManifest(r, raw, []string{parent})
		if m.obj == nil {
			if len(m.problems) == 0 {
				t.Fatal("refused without a reason")
			}
			return
		}
		if len(m.problems) > 0 || m.state != identityKnown {
			t.Fatalf("accepted with problems %q, state %v", m.problems, m.state)
		}
		gvk := m.obj.GroupVersionKind()
		if !r.kinds[gvk] || m.obj.GetNamespace() == "" || m.obj.GetName() == "" {
			t.Fatalf("accepted %v %s/%s", gvk, m.obj.GetNamespace(), m.obj.GetName())
		}
		if m.obj.GetLabels()[outputs.OwnerLabel] != r.owner || m.obj.GetAnnotations()[outputs.ParentsAnnotation] != parent {
			t.Fatal("owner label or parents annotation not set")
		}
		md := m.obj.Object["metadata"].(map[string]any)
		for k := range md {
			if !allowedMetadata[k] {
				t.Fatalf("accepted metadata.%s", k)
			}
		}
		if _, err := json.Marshal(m.obj.Object); err != nil {
			t.Fatalf("accepted object does not encode: %v", err)
		}
	})
}

// With ambient federation's kinds allowed, the agent still writes only
// what ambient federation writes: a hostile server cannot make it create a
// LoadBalancer, NodePort, externalIPs or ExternalName Service, one that
// selects other pods, nor a Gateway that deploys a proxy.
func TestCheckManifestLimitsFederatedKinds(t *testing.T) {
	r := testRules()
	for _, k := range AmbientFederationKinds {
		r.kinds[k], r.groupKinds[k.GroupKind()] = true, true
	}
	const svc = `{"apiVersion":"v1","kind":"Service","metadata":{"name":"ratings","namespace":"shop","labels":{"istio.io/global":"true"}},"spec":%s}`
	const gw = `{"apiVersion":"gateway.networking.k8s.io/v1","kind":"Gateway","metadata":{"name":"relaymesh-c2-ew","namespace":"istio-system"},"spec":%s}`
	good := `{"selector":{"relaymesh.io/global-service":"ratings"},"ports":[{"name":"http","port":9080,"protocol":"TCP","targetPort":9080,"appProtocol":"http"}]}`
	for _, tc := range []struct {
		name, manifest, problem string
	}{
		{"the global Service", fmt.Sprintf(svc, good), ""},
		{"ClusterIP said", fmt.Sprintf(svc, `{"type":"ClusterIP","selector":{"relaymesh.io/global-service":"ratings"},"ports":[]}`), ""},
		{"LoadBalancer", fmt.Sprintf(svc, `{"type":"LoadBalancer","selector":{"relaymesh.io/global-service":"ratings"}}`), "spec.type LoadBalancer is not allowed"},
		{"externalIPs", fmt.Sprintf(svc, `{"externalIPs":["10.0.0.1"],"selector":{"relaymesh.io/global-service":"ratings"}}`), "spec.externalIPs is not allowed"},
		{"ExternalName", fmt.Sprintf(svc, `{"type":"ExternalName","externalName":"evil.example","selector":{"relaymesh.io/global-service":"ratings"}}`), "spec.externalName is not allowed"},
		{"nodePort", fmt.Sprintf(svc, `{"selector":{"relaymesh.io/global-service":"ratings"},"ports":[{"port":80,"nodePort":30080}]}`), "spec.ports[0].nodePort is not allowed"},
		{"selects other pods", fmt.Sprintf(svc, `{"selector":{"app":"ratings"}}`), "spec.selector must be exactly relaymesh.io/global-service: ratings"},
		{"selects another Service's entries", fmt.Sprintf(svc, `{"selector":{"relaymesh.io/global-service":"reviews"}}`), "spec.selector must be exactly"},
		{"no selector", fmt.Sprintf(svc, `{}`), "spec.selector must be exactly"},
		{"a federated entry", `{"apiVersion":"networking.istio.io/v1","kind":"WorkloadEntry","metadata":{"name":"ratings-c2-1","namespace":"shop","labels":{"relaymesh.io/global-service":"ratings"}},"spec":{"address":"10.2.0.21","network":"net-2","labels":{"relaymesh.io/global-service":"ratings"}}}`, ""},
		{"an entry a user's Service would select", `{"apiVersion":"networking.istio.io/v1","kind":"WorkloadEntry","metadata":{"name":"x","namespace":"shop","labels":{"relaymesh.io/global-service":"ratings"}},"spec":{"address":"10.9.9.9","labels":{"app":"ratings","relaymesh.io/global-service":"ratings"}}}`, "spec.labels must be exactly relaymesh.io/global-service"},
		{"an entry without labels", `{"apiVersion":"networking.istio.io/v1","kind":"WorkloadEntry","metadata":{"name":"x","namespace":"shop"},"spec":{"address":"10.9.9.9"}}`, "metadata.labels must be exactly"},
		{"a remote network's gateway", fmt.Sprintf(gw, `{"gatewayClassName":"istio-remote","listeners":[]}`), ""},
		{"a gateway that deploys a proxy", fmt.Sprintf(gw, `{"gatewayClassName":"istio","listeners":[]}`), `spec.gatewayClassName "istio" is not allowed`},
		{"an east-west gateway", fmt.Sprintf(gw, `{"gatewayClassName":"istio-east-west"}`), "is not allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := checkManifest(r, []byte(tc.manifest), nil)
			if tc.problem == "" {
				assert.Empty(t, m.problems)
				require.NotNil(t, m.obj)
				return
			}
			assert.Contains(t, strings.Join(m.problems, "\n"), tc.problem)
			assert.Nil(t, m.obj)
		})
	}
}

// With --ambient-failover an entry may carry a user Service's labels, but
// only as what ambient failover writes: the same labels in metadata and
// spec, not mixed with the federated label, on a network; it is then
// marked for the cluster check (checkJoins), never applied on its own word.
func TestCheckManifestEntriesThatJoinAService(t *testing.T) {
	r := testRules()
	for _, k := range AmbientFederationKinds {
		r.kinds[k], r.groupKinds[k.GroupKind()] = true, true
	}
	r.joinServices = true
	const we = `{"apiVersion":"networking.istio.io/v1","kind":"WorkloadEntry","metadata":{"name":"reviews-c2-1","namespace":"shop","labels":%s},"spec":{"address":"10.2.0.11","network":%q,"labels":%s}}`
	for _, tc := range []struct {
		name, manifest, problem string
		joins                   map[string]string
	}{
		{"joins reviews", fmt.Sprintf(we, `{"app":"reviews"}`, "net-2", `{"app":"reviews"}`), "", map[string]string{"app": "reviews"}},
		{"a federated entry still", fmt.Sprintf(we, `{"relaymesh.io/global-service":"reviews"}`, "net-2", `{"relaymesh.io/global-service":"reviews"}`), "", nil},
		{"labels differ", fmt.Sprintf(we, `{"app":"reviews"}`, "net-2", `{"app":"ratings"}`), "metadata.labels and spec.labels differ", nil},
		{"metadata has more", fmt.Sprintf(we, `{"app":"reviews","x":"y"}`, "net-2", `{"app":"reviews"}`), "metadata.labels and spec.labels differ", nil},
		{"mixed with the federated label", fmt.Sprintf(we, `{"app":"reviews","relaymesh.io/global-service":"reviews"}`, "net-2", `{"app":"reviews","relaymesh.io/global-service":"reviews"}`), "mixes relaymesh.io/global-service", nil},
		{"no network", fmt.Sprintf(we, `{"app":"reviews"}`, "", `{"app":"reviews"}`), "spec.network is empty", nil},
		{"no labels", fmt.Sprintf(we, `{}`, "net-2", `{}`), "spec.labels is empty", nil},
		{"a label that is not a string", fmt.Sprintf(we, `{"app":"reviews"}`, "net-2", `{"app":7}`), "spec.labels.app is not a string", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := checkManifest(r, []byte(tc.manifest), nil)
			if tc.problem == "" {
				assert.Empty(t, m.problems)
				require.NotNil(t, m.obj)
				assert.Equal(t, tc.joins, m.joins)
				return
			}
			assert.Contains(t, strings.Join(m.problems, "\n"), tc.problem)
			assert.Nil(t, m.obj)
		})
	}
	// Off, the same entry is refused before anything is read.
	r.joinServices = false
	m := checkManifest(r, []byte(fmt.Sprintf(we, `{"app":"reviews"}`, "net-2", `{"app":"reviews"}`)), nil)
	assert.Contains(t, strings.Join(m.problems, "\n"), "need --ambient-failover")
}

// FuzzCheckJoiningEntry: with --ambient-failover, an accepted WorkloadEntry
// is either labelled only for its global Service, or marked for the
// cluster check with exactly the labels it carries in spec and metadata
// and a network: never applied on the manifest's word alone.
func FuzzCheckJoiningEntry(f *testing.F) {
	f.Add(`{"app":"reviews"}`, `{"app":"reviews"}`, "net-2")
	f.Add(`{"relaymesh.io/global-service":"r"}`, `{"relaymesh.io/global-service":"r"}`, "")
	f.Add(`{"app":"a","b":"c"}`, `{"app":"a"}`, "n")
	f.Add(`{}`, `null`, "n")
	r := testRules()
	for _, k := range AmbientFederationKinds {
		r.kinds[k], r.groupKinds[k.GroupKind()] = true, true
	}
	r.joinServices = true
	f.Fuzz(func(t *testing.T, metaLabels, specLabels, network string) {
		raw := fmt.Sprintf(`{"apiVersion":"networking.istio.io/v1","kind":"WorkloadEntry","metadata":{"name":"e","namespace":"shop","labels":%s},"spec":{"address":"10.2.0.1","network":%q,"labels":%s}}`, metaLabels, network, specLabels)
		m := checkManifest(r, []byte(raw), nil)
		if m.obj == nil {
			return
		}
		spec, _ := m.obj.Object["spec"].(map[string]any)
		labels, _ := spec["labels"].(map[string]any)
		if m.joins == nil {
			if len(labels) != 1 || labels["relaymesh.io/global-service"] == nil {
				t.Fatalf("accepted spec.labels %v without the cluster check", labels)
			}
			return
		}
		if network == "" || len(m.joins) == 0 || len(m.joins) != len(labels) {
			t.Fatalf("joins %v, labels %v, network %q", m.joins, labels, network)
		}
		for k, v := range m.joins {
			if labels[k] != v || m.obj.GetLabels()[k] != v {
				t.Fatalf("joins %v differ from spec %v or metadata %v", m.joins, labels, m.obj.GetLabels())
			}
		}
	})
}
