package accessaudit

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	"github.com/relaymesh/relaymesh/federation"
	"github.com/relaymesh/relaymesh/policy"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAgreesWithTranslation checks the audit's view of every golden input
// against the AuthorizationPolicies translation produces: a restricted
// Destination's principals are exactly those of its AuthorizationPolicy's
// rules, an open one has no AuthorizationPolicy and no deny-all in its
// cluster, and a deny-by-default one has the deny-all.
func TestAgreesWithTranslation(t *testing.T) {
	inputs, err := filepath.Glob("testdata/*/input.yaml")
	require.NoError(t, err)
	for _, path := range inputs {
		t.Run(filepath.Base(filepath.Dir(path)), func(t *testing.T) {
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			in := &translation.Input{}
			require.NoError(t, in.Decode(b))
			a, out, err := newAuditor(t.Context(), in, ConfigForTest(t, "relaymesh"))
			require.NoError(t, err)

			authz := map[string][]string{} // cluster/namespace/name → principals of its rules
			denyAll := map[string]bool{}   // cluster/namespace
			for _, o := range out.Objects() {
				if o.Object.GetKind() != "AuthorizationPolicy" {
					continue
				}
				if o.Object.GetName() == federation.GlobalDenyName {
					denyAll[o.Cluster+"/"+o.Object.GetNamespace()] = true
					continue
				}
				key := o.Cluster + "/" + o.Object.GetNamespace() + "/" + o.Object.GetName()
				authz[key] = []string{}
				spec, _ := o.Object.Object["spec"].(map[string]any)
				rules, _ := spec["rules"].([]any)
				for _, r := range rules {
					from, _ := r.(map[string]any)["from"].([]any)
					for _, f := range from {
						src, _ := f.(map[string]any)["source"].(map[string]any)
						ps, _ := src["principals"].([]any)
						for _, p := range ps {
							s, _ := p.(string)
							authz[key] = append(authz[key], s)
						}
					}
				}
			}
			for j, d := range a.dests {
				key := d.Cluster + "/" + d.Namespace + "/relaymesh-" + d.Service
				if d.DataPlaneMode != "" {
					// Ambient workloads read .ztunnel (which also admits
					// the waypoint) and .waypoint; a policy that needs a
					// waypoint is in neither.
					var got []string
					ztunnel, restricted := authz[key+".ztunnel"]
					assert.Equal(t, len(d.policies) > 0, restricted, "%s: restricted by a policy at ztunnel", d.ID)
					wp := waypointPrincipal(in, d)
					for _, p := range append(ztunnel, authz[key+".waypoint"]...) {
						if p != wp {
							got = append(got, p)
						}
					}
					want := []string{}
					for _, pi := range d.policies {
						if _, no := a.aps[pi].needsWaypoint[j]; !no {
							want = append(want, slices.Collect(maps.Keys(a.aps[pi].principal))...)
						}
					}
					assert.Equal(t, sortedSet(want), sortedSet(got), "%s: principals at the ambient workloads", d.ID)
					if d.DataPlaneMode == "ambient" {
						assert.NotContains(t, authz, key, "%s: no sidecar object", d.ID)
						continue
					}
				}
				got, restricted := authz[key]
				if got == nil {
					got = []string{}
				}
				assert.Equal(t, len(d.policies) > 0, restricted, "%s: restricted by a policy", d.ID)
				want := []string{}
				for _, pi := range d.policies {
					want = append(want, slices.Collect(maps.Keys(a.aps[pi].principal))...)
					// Foreign identities only where d's VirtualMesh trusts
					// their trust domain (ambient pods hold no foreign root).
					for pr := range a.aps[pi].foreign {
						td, _, _ := strings.Cut(pr, "/")
						if policy.AdmitsForeign(a.plan, in, d.d, td) {
							want = append(want, pr)
						}
					}
				}
				slices.Sort(want)
				slices.Sort(got)
				assert.Equal(t, slices.Compact(want), slices.Compact(got), "%s: principals", d.ID)
				mesh := in.MeshOf(d.d.Spec.Mesh)
				if mesh == nil || mesh.Spec.Istio == nil {
					continue
				}
				root := mesh.Spec.Istio.Installation.Cluster + "/" + mesh.Spec.Istio.Installation.Namespace
				assert.Equal(t, d.DenyByDefault, denyAll[root], "%s: deny by default", d.ID)
			}
		})
	}
}

// sortedSet is xs sorted without repeats, never nil.
func sortedSet(xs []string) []string {
	out := append([]string{}, xs...)
	slices.Sort(out)
	return slices.Compact(out)
}

// waypointPrincipal is the identity of the waypoint d is bound to, as its
// mesh reports it ("" when there is none).
func waypointPrincipal(in *translation.Input, d *dest) string {
	ref := d.d.Spec.KubeService.Waypoint
	m := in.MeshOf(d.d.Spec.Mesh)
	if ref == nil || m == nil || m.Spec.Istio == nil || m.Spec.Istio.Ambient == nil {
		return ""
	}
	for _, w := range m.Spec.Istio.Ambient.Waypoints {
		if w.Name == ref.Name && w.Namespace == ref.Namespace {
			return m.Spec.Istio.TrustDomain + "/ns/" + w.Namespace + "/sa/" + w.ServiceAccount
		}
	}
	return ""
}

func TestPathCovers(t *testing.T) {
	tests := []struct {
		q, p string
		want bool
	}{
		{"/a", "/a", true},
		{"/a", "/b", false},
		{"*", "/anything", true},
		{"*", "*.png", true},
		{"/api/*", "/api/v1/users", true},
		{"/api/*", "/api/v1/*", true},
		{"/api/*", "/apix", false},
		{"/api/v1/*", "/api/*", false},
		{"/api/*", "*.json", false},
		{"*.json", "/a/b.json", true},
		{"*.json", "*/b.json", true},
		{"*.json", "/a/b.json*", false},
		{"*.json", "/a/b.png", false},
		{"/a", "/a*", false},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, pathCovers(tt.q, tt.p), "%q covers %q", tt.q, tt.p)
	}
}

func TestCovers(t *testing.T) {
	all := Grant{Policy: "a"}
	get := Grant{Policy: "b", Methods: []string{"GET"}}
	getPost := Grant{Policy: "c", Methods: []string{"GET", "POST"}}
	api := Grant{Policy: "d", Paths: []string{"/api/*"}}
	apiV1Get := Grant{Policy: "e", Paths: []string{"/api/v1/*"}, Methods: []string{"GET"}}
	port80 := Grant{Policy: "f", Ports: []int32{80}}
	assert.True(t, covers(all, get))
	assert.True(t, covers(all, apiV1Get))
	assert.False(t, covers(get, all))
	assert.True(t, covers(getPost, get))
	assert.False(t, covers(get, getPost))
	assert.True(t, covers(api, apiV1Get))
	assert.False(t, covers(apiV1Get, api))
	assert.False(t, covers(api, get), "paths restrict what methods do not")
	assert.True(t, covers(all, port80))
	assert.False(t, covers(port80, all))
}

func TestProtocol(t *testing.T) {
	for name, want := range map[string]string{
		"http": ProtocolHTTP, "http-web": ProtocolHTTP, "grpc": ProtocolHTTP, "grpc-web": ProtocolHTTP, "http2": ProtocolHTTP,
		"tcp": ProtocolTCP, "tls-x": ProtocolTCP, "https": ProtocolTCP, "redis": ProtocolTCP, "": ProtocolAuto, "web": ProtocolAuto,
	} {
		assert.Equal(t, want, protocol(portNamed(name)), "port name %q", name)
	}
}

func portNamed(name string) discoveryv1alpha1.ServicePort {
	return discoveryv1alpha1.ServicePort{Port: 80, Name: name}
}
