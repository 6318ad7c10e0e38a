package registration

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestRequestValidate(t *testing.T) {
	good := Request{Cluster: "cluster-1", Namespace: "relaymesh", RemoteNamespace: "relaymesh", ServerAddress: "relay.example.com:9900", TokenTTL: time.Hour}
	require.NoError(t, good.Validate())
	for _, tc := range []struct {
		name string
		mod  func(*Request)
		want []string
	}{
		{"bad cluster name", func(r *Request) { r.Cluster = "Cluster_1" }, []string{"Cluster_1"}},
		{"no server address", func(r *Request) { r.ServerAddress = "" }, []string{"--server-address is required"}},
		{"address without a port", func(r *Request) { r.ServerAddress = "relay.example.com" }, []string{`--server-address "relay.example.com"`}},
		{"no namespace", func(r *Request) { r.RemoteNamespace = "" }, []string{"namespaces must not be empty"}},
		{"ttl zero", func(r *Request) { r.TokenTTL = 0 }, []string{"--token-ttl 0s out of range"}},
		{"ttl too long", func(r *Request) { r.TokenTTL = identity.MaxTokenTTL + time.Second }, []string{"out of range"}},
		{"every fault at once", func(r *Request) { r.Cluster, r.ServerAddress, r.TokenTTL = "", "", -time.Second }, []string{"--server-address is required", "--token-ttl -1s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := good
			tc.mod(&r)
			err := r.Validate()
			require.Error(t, err)
			for _, w := range tc.want {
				assert.ErrorContains(t, err, w)
			}
		})
	}
}

func chartPath(name string) string { return filepath.Join("..", "..", "..", "..", "charts", name) }

func bundle() *Bundle {
	return &Bundle{Cluster: "cluster-1", Namespace: "relaymesh",
		Secrets:   []*corev1.Secret{{ObjectMeta: metav1.ObjectMeta{Name: identity.RootSecret}}, {ObjectMeta: metav1.ObjectMeta{Name: identity.TokenSecret}}},
		ConfigMap: &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: AgentConfigMap}},
		Values:    map[string]any{"cluster": "cluster-1", "serverAddress": "relay.example.com:9900"}}
}

// The agent chart renders with the registration's values over the user's:
// a --set cannot point the agent at another cluster or server.
func TestRenderChart(t *testing.T) {
	c := Chart{Ref: chartPath(AgentChartName), Set: []string{"replicas=1", "cluster=someone-else", "serverAddress=evil.example.com:1"}}
	l, err := c.Load()
	require.NoError(t, err)
	out, err := RenderChart(c, l, bundle())
	require.NoError(t, err)
	for _, want := range []string{"kind: Deployment", "kind: ServiceAccount", "replicas: 1", "--cluster=cluster-1", "--server-address=relay.example.com:9900", "namespace: relaymesh"} {
		assert.Contains(t, out, want)
	}
	assert.NotContains(t, out, "someone-else")
	assert.NotContains(t, out, "evil.example.com")
}

// Everything that can be wrong with the chart or its values is found by
// Load, before anything is registered.
func TestChartLoadRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Chart
		want string
	}{
		{"not the agent chart", Chart{Ref: chartPath("relaymesh-server")}, "is not the relaymesh-agent chart"},
		{"no such chart", Chart{Ref: filepath.Join(t.TempDir(), "missing")}, "chart "},
		{"missing values file", Chart{Ref: chartPath(AgentChartName), ValueFiles: []string{filepath.Join(t.TempDir(), "values.yaml")}}, "chart values"},
		{"bad --set", Chart{Ref: chartPath(AgentChartName), Set: []string{"a[=b"}}, "chart values"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.c.Load()
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

func TestBundleObjects(t *testing.T) {
	var names []string
	for _, o := range bundle().Objects() {
		m, err := meta.Accessor(o)
		require.NoError(t, err)
		names = append(names, m.GetName())
	}
	assert.Equal(t, "relaymesh,"+identity.RootSecret+","+identity.TokenSecret+","+AgentConfigMap, strings.Join(names, ","))
}

// The printed cleanup names every kind the agent applies, by its real
// resource name, and selects only what carries the agent's owner label.
func TestCleanupCommandsNameEveryKindTheAgentApplies(t *testing.T) {
	cmds := CleanupCommands("relaymesh-agent")
	require.Len(t, cmds, 5)
	for _, want := range []string{"virtualservices.networking.istio.io", "destinationrules.networking.istio.io", "serviceentries.networking.istio.io",
		"gateways.networking.istio.io", "authorizationpolicies.security.istio.io", "peerauthentications.security.istio.io", "-l relaymesh.io/owner=relaymesh-agent"} {
		assert.Contains(t, cmds[0], want)
	}
	assert.Equal(t, "kubectl delete secrets --all-namespaces -l relaymesh.io/owner=relaymesh-agent --field-selector metadata.name=cacerts", cmds[1])
	// A command per Gateway API route: a cluster may serve some of them.
	for i, route := range []string{"httproutes.gateway.networking.k8s.io", "grpcroutes.gateway.networking.k8s.io", "tcproutes.gateway.networking.k8s.io"} {
		assert.Contains(t, cmds[2+i], "kubectl delete "+route+" --all-namespaces -l relaymesh.io/owner=relaymesh-agent")
	}
}

// A grant is checked as the KubernetesCluster schema would check it, and
// every fault is reported at once.
func TestValidateGrants(t *testing.T) {
	g := func(names ...string) []multiclusterv1alpha1.TrustDomainGrant {
		var out []multiclusterv1alpha1.TrustDomainGrant
		for _, n := range names {
			out = append(out, multiclusterv1alpha1.TrustDomainGrant{Name: n})
		}
		return out
	}
	require.NoError(t, ValidateGrants(nil))
	require.NoError(t, ValidateGrants(g("eu.local", "cluster.local", "a_b-c.example")))
	many := make([]string, 33)
	for i := range many {
		many[i] = fmt.Sprintf("td-%d.local", i)
	}
	for _, tc := range []struct {
		name   string
		grants []multiclusterv1alpha1.TrustDomainGrant
		want   []string
	}{
		{"empty", g(""), []string{`--trust-domain "": empty`}},
		{"upper case", g("EU.local"), []string{"not a SPIFFE trust domain"}},
		{"a URI, not a trust domain", g("spiffe://eu.local"), []string{"not a SPIFFE trust domain"}},
		{"oversized", g(strings.Repeat("a", 300)), []string{"300 bytes, at most 255"}},
		{"not UTF-8", g("eu\xff.local"), []string{"not UTF-8"}},
		{"twice", g("eu.local", "eu.local"), []string{`"eu.local" is given twice`}},
		{"too many", g(many...), []string{"33 trust domains: at most 32"}},
		{"every fault at once", g("", "x.local", "x.local", "A"), []string{"empty", "given twice", `"A" is not`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateGrants(tc.grants)
			require.Error(t, err)
			for _, w := range tc.want {
				assert.ErrorContains(t, err, w)
			}
		})
	}
}

// Registration refuses a grant another cluster already holds, unless both
// mark it shared: registering it would take the trust domain from both.
func TestCheckExclusive(t *testing.T) {
	kc := func(name string, grants ...multiclusterv1alpha1.TrustDomainGrant) multiclusterv1alpha1.KubernetesCluster {
		return multiclusterv1alpha1.KubernetesCluster{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: multiclusterv1alpha1.KubernetesClusterSpec{TrustDomains: grants}}
	}
	own := func(n string) multiclusterv1alpha1.TrustDomainGrant {
		return multiclusterv1alpha1.TrustDomainGrant{Name: n}
	}
	shared := func(n string) multiclusterv1alpha1.TrustDomainGrant {
		return multiclusterv1alpha1.TrustDomainGrant{Name: n, Shared: true}
	}
	registered := []multiclusterv1alpha1.KubernetesCluster{kc("cluster-1"), kc("cluster-2", shared("cluster.local"))}
	for _, tc := range []struct {
		name   string
		grants []multiclusterv1alpha1.TrustDomainGrant
		want   string
	}{
		{"the default grant", nil, ""},
		{"a trust domain of its own", []multiclusterv1alpha1.TrustDomainGrant{own("eu.example")}, ""},
		{"another cluster's default grant", []multiclusterv1alpha1.TrustDomainGrant{own("cluster-1.local")}, `trust domain "cluster-1.local" is already granted to cluster cluster-1`},
		{"shared here, not there", []multiclusterv1alpha1.TrustDomainGrant{shared("cluster-1.local")}, `already granted to cluster cluster-1`},
		{"shared there, not here", []multiclusterv1alpha1.TrustDomainGrant{own("cluster.local")}, `already granted to cluster cluster-2`},
		{"shared on both", []multiclusterv1alpha1.TrustDomainGrant{own("eu.local"), shared("cluster.local")}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckExclusive(registered, "eu", tc.grants)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.want)
			assert.ErrorContains(t, err, "--shared-trust-domain")
		})
	}
	// A cluster named like the trust domain another holds explicitly.
	err := CheckExclusive([]multiclusterv1alpha1.KubernetesCluster{kc("prod", own("eu.local"))}, "eu", nil)
	assert.ErrorContains(t, err, `trust domain "eu.local" is already granted to cluster prod`)
	assert.Equal(t, []multiclusterv1alpha1.TrustDomainGrant{{Name: "eu.local"}}, Grants("eu", nil), "the default grant is <cluster>.local")
}
