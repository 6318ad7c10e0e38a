package localcluster

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

func TestValidateClusterNames(t *testing.T) {
	many := make([]string, MaxClusters+1)
	for i := range many {
		many[i] = "c" + strings.Repeat("x", i)
	}
	tests := []struct {
		name    string
		in      []string
		wantErr string
	}{
		{"ok", []string{"mgmt", "cluster-1", "cluster-2"}, ""},
		{"empty list", nil, "at least one cluster"},
		{"empty name", []string{"mgmt", ""}, `[1] "" is not a DNS label`},
		{"upper case", []string{"Mgmt"}, "not a DNS label"},
		{"leading dash", []string{"-a"}, "not a DNS label"},
		{"dot", []string{"a.b"}, "not a DNS label"},
		{"path traversal", []string{"../../etc"}, "not a DNS label"},
		{"too long", []string{strings.Repeat("a", 64)}, "not a DNS label"},
		{"duplicate", []string{"a", "b", "a"}, `[2] "a" is listed twice`},
		{"too many", many, "at most 16"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateClusterNames(tt.in)
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
}

func TestParseClusterNames(t *testing.T) {
	got, err := ParseClusterNames("mgmt, cluster-1,cluster-2")
	require.NoError(t, err)
	assert.Equal(t, []string{"mgmt", "cluster-1", "cluster-2"}, got)

	for _, bad := range []string{"", ",", "a,,b", "a;b", strings.Repeat("a,", 2000)} {
		_, err := ParseClusterNames(bad)
		assert.Error(t, err, "input %q", bad)
	}
}

func FuzzParseClusterNames(f *testing.F) {
	for _, s := range []string{"mgmt,cluster-1,cluster-2", "", "a,a", "A", "a-,b", strings.Repeat("x", 70)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		names, err := ParseClusterNames(s)
		if err != nil {
			return
		}
		require.NotEmpty(t, names)
		require.LessOrEqual(t, len(names), MaxClusters)
		seen := map[string]bool{}
		for _, n := range names {
			require.True(t, clusterName.MatchString(n) && len(n) <= 63, "accepted bad name %q", n)
			require.False(t, seen[n], "accepted duplicate %q", n)
			seen[n] = true
		}
	})
}

func TestConfigValidateReportsEveryField(t *testing.T) {
	err := Config{ReadyTimeout: -1}.Validate()
	require.Error(t, err)
	for _, want := range []string{"dir: required", "clusters: at least one", "readyTimeout"} {
		assert.Contains(t, err.Error(), want)
	}
}

func TestDownRefusesDirectoryWithoutState(t *testing.T) {
	dir := t.TempDir()
	keep := filepath.Join(dir, "keep.txt")
	require.NoError(t, os.WriteFile(keep, []byte("x"), 0o600))
	err := Down(dir)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no local clusters recorded")
	assert.FileExists(t, keep, "Down must not delete a directory it did not create")
}

func TestDownRejectsCorruptState(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, stateFile), []byte(`{"pids":[1]}`), 0o600))
	err := Down(dir)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "refusing to signal pid 1")
	assert.DirExists(t, dir)

	require.NoError(t, os.WriteFile(filepath.Join(dir, stateFile), []byte(`not json`), 0o600))
	require.Error(t, Down(dir))
	assert.DirExists(t, dir)
}

// startEnv starts clusters for a test and stops them when it ends, failing
// the test if any process survives.
func startEnv(t *testing.T, detach bool, names ...string) *Env {
	t.Helper()
	SkipIfShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := Start(ctx, Config{Dir: t.TempDir(), Clusters: names, Detach: detach})
	require.NoError(t, err)
	t.Cleanup(func() {
		pids := env.Pids()
		require.NoError(t, env.Stop())
		for _, pid := range pids {
			assert.False(t, Alive(pid), "process %d still running after Stop", pid)
		}
	})
	return env
}

var (
	virtualMeshGVR    = networkingv1alpha1.VirtualMeshes
	virtualServiceGVR = outputs.VirtualServices
)

func object(t *testing.T, y string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	require.NoError(t, yaml.Unmarshal([]byte(y), &u.Object))
	return u
}

const validVirtualMesh = `
apiVersion: networking.relaymesh.io/v1alpha1
kind: VirtualMesh
metadata: {name: vm, namespace: default}
spec:
  meshes: [{clusterName: cluster-1, namespace: istio-system, name: istiod}]
  mtls: {shared: {rootCA: {generated: {}}}}
  globalAccessPolicy: Enabled
`

const validVirtualService = `
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews]
  http:
  - route:
    - destination: {host: reviews}
`

func TestThreeClusters(t *testing.T) {
	env := startEnv(t, false, "mgmt", "cluster-1", "cluster-2")
	ctx := context.Background()
	require.Len(t, env.Clusters(), 3)

	mgmt := env.Cluster("mgmt")
	require.NotNil(t, mgmt)
	dyn, err := dynamic.NewForConfig(mgmt.RESTConfig())
	require.NoError(t, err)
	vms := dyn.Resource(virtualMeshGVR).Namespace("default")
	vss := dyn.Resource(virtualServiceGVR).Namespace("default")

	t.Run("valid VirtualMesh is accepted", func(t *testing.T) {
		got, err := vms.Create(ctx, object(t, validVirtualMesh), metav1.CreateOptions{})
		require.NoError(t, err)
		hs, _, _ := unstructured.NestedString(got.Object, "spec", "federation", "hostnameSuffix")
		assert.Empty(t, hs, "no federation block, no defaulted suffix")
		rs, _, _ := unstructured.NestedString(got.Object, "spec", "mtls", "rotationStrategy")
		assert.Equal(t, "MultiRoot", rs, "schema default applied by the real apiserver")
	})

	rejections := []struct {
		name, path string
		value      any
		want       []string
	}{
		{"invalid enum", "spec.globalAccessPolicy", "Sometimes", []string{"spec.globalAccessPolicy", "Unsupported value", `"Sometimes"`}},
		{"invalid rotation enum", "spec.mtls.rotationStrategy", "Sideways", []string{"spec.mtls.rotationStrategy", "Unsupported value"}},
		{"two root sources", "spec.mtls.shared.rootCA.secret", map[string]any{"name": "root"}, []string{"exactly one of generated, secret, external or pkcs11"}},
		{"bad duration", "spec.mtls.shared.rootCA.generated.ttl", "one year", []string{"spec.mtls.shared.rootCA.generated.ttl", "must be a Go duration such as 30s"}},
		{"no meshes", "spec.meshes", []any{}, []string{"spec.meshes", "at least 1 items"}},
		{"a mesh named by object name only", "spec.meshes", []any{map[string]any{"name": "istiod-istio-system-cluster-1"}}, []string{"spec.meshes[0].clusterName", "Required value"}},
		{"a mesh cluster that is no DNS label", "spec.meshes", []any{map[string]any{"clusterName": "Cluster_1", "namespace": "istio-system", "name": "istiod"}}, []string{"spec.meshes[0].clusterName", "should match"}},
		{"an unknown trust domain policy", "spec.mtls.trustDomains", "Anything", []string{"spec.mtls.trustDomains", "Unsupported value"}},
	}
	for _, tt := range rejections {
		t.Run("VirtualMesh "+tt.name+" is rejected", func(t *testing.T) {
			u := object(t, validVirtualMesh)
			u.SetName("bad-" + strings.ReplaceAll(tt.name, " ", "-"))
			require.NoError(t, unstructured.SetNestedField(u.Object, tt.value, strings.Split(tt.path, ".")...))
			_, err := vms.Create(ctx, u, metav1.CreateOptions{})
			require.Error(t, err)
			assert.True(t, apierrors.IsInvalid(err), "want a schema rejection, got %v", err)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
			if tt.name == "bad duration" {
				assert.NotContains(t, err.Error(), "should match '^", "the schema's message, not its raw regex")
			}
			_, err = vms.Get(ctx, u.GetName(), metav1.GetOptions{})
			assert.True(t, apierrors.IsNotFound(err), "rejected object must not exist")
		})
	}

	t.Run("other kinds: defaults and rejections", func(t *testing.T) {
		clusters := dyn.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace("default")
		got, err := clusters.Create(ctx, object(t, `
apiVersion: multicluster.relaymesh.io/v1alpha1
kind: KubernetesCluster
metadata: {name: cluster-1, namespace: default}
spec: {}
`), metav1.CreateOptions{})
		require.NoError(t, err)
		mode, _, _ := unstructured.NestedString(got.Object, "spec", "mode")
		assert.Equal(t, "relay", mode, "relay mode is the default")

		tps := dyn.Resource(networkingv1alpha1.TrafficPolicies).Namespace("default")
		aps := dyn.Resource(networkingv1alpha1.AccessPolicies).Namespace("default")
		_, err = tps.Create(ctx, object(t, `
apiVersion: networking.relaymesh.io/v1alpha1
kind: TrafficPolicy
metadata: {name: ok, namespace: default}
spec:
  policy:
    trafficShift: {destinations: [{weight: 80, kubeService: {name: reviews, namespace: bookinfo, clusterName: cluster-1}}]}
    faultInjection: {fixedDelay: 2s, percentage: 12.5}
`), metav1.CreateOptions{})
		require.NoError(t, err)

		ftds := dyn.Resource(networkingv1alpha1.FederatedTrustDomains).Namespace("default")
		_, err = ftds.Create(ctx, object(t, `
apiVersion: networking.relaymesh.io/v1alpha1
kind: FederatedTrustDomain
metadata: {name: spire, namespace: default}
spec:
  trustDomain: spire.example
  bundleEndpointURL: https://spire.example:8443/
  profile: https_spiffe
  endpointSPIFFEID: spiffe://spire.example/spire/server
  bootstrapBundle: "-----BEGIN CERTIFICATE-----"
`), metav1.CreateOptions{})
		require.NoError(t, err)
		const ftd = "apiVersion: networking.relaymesh.io/v1alpha1\nkind: FederatedTrustDomain\nmetadata: {name: f, namespace: default}\n"
		const ap = "apiVersion: networking.relaymesh.io/v1alpha1\nkind: AccessPolicy\nmetadata: {name: src, namespace: default}\n"
		vms := dyn.Resource(networkingv1alpha1.VirtualMeshes).Namespace("default")
		_, err = aps.Create(ctx, object(t, ap+"spec: {sourceSelector: [{spiffeIDs: ['spiffe://spire.example/ns/default/sa/client']}]}"), metav1.CreateOptions{})
		require.NoError(t, err, "an AccessPolicy naming a foreign identity")
		require.NoError(t, aps.Delete(ctx, "src", metav1.DeleteOptions{}))

		for _, tt := range []struct {
			name string
			ri   dynamic.ResourceInterface
			y    string
			want string
		}{
			{"foreign trust domain over plain http", ftds, ftd + "spec: {trustDomain: a.example, bundleEndpointURL: 'http://a.example/', profile: https_web}", "must be an https:// URL"},
			{"foreign trust domain with capitals", ftds, ftd + "spec: {trustDomain: A.example, bundleEndpointURL: 'https://a.example/', profile: https_web}", "must be a SPIFFE trust domain name"},
			{"unknown bundle profile", ftds, ftd + "spec: {trustDomain: a.example, bundleEndpointURL: 'https://a.example/', profile: http}", "Unsupported value"},
			{"https_spiffe without a bootstrap bundle", ftds, ftd + "spec: {trustDomain: a.example, bundleEndpointURL: 'https://a.example/', profile: https_spiffe, endpointSPIFFEID: 'spiffe://a.example/s'}", "needs endpointSPIFFEID and bootstrapBundle"},
			{"endpoint ID in another trust domain", ftds, ftd + "spec: {trustDomain: a.example, bundleEndpointURL: 'https://a.example/', profile: https_spiffe, endpointSPIFFEID: 'spiffe://b.example/s', bootstrapBundle: x}", "must be a SPIFFE ID with a path in trustDomain"},
			{"https_web with an endpoint ID", ftds, ftd + "spec: {trustDomain: a.example, bundleEndpointURL: 'https://a.example/', profile: https_web, endpointSPIFFEID: 'spiffe://a.example/s'}", "for the https_spiffe profile only"},
			{"cluster name not a DNS label", clusters, "apiVersion: multicluster.relaymesh.io/v1alpha1\nkind: KubernetesCluster\nmetadata: {name: cluster.one, namespace: default}\nspec: {}", "must be a DNS label"},
			{"kubeconfig mode without secret", clusters, "apiVersion: multicluster.relaymesh.io/v1alpha1\nkind: KubernetesCluster\nmetadata: {name: c2, namespace: default}\nspec: {mode: kubeconfig}", "kubeconfigSecretRef is required"},
			{"weight over 100", tps, "apiVersion: networking.relaymesh.io/v1alpha1\nkind: TrafficPolicy\nmetadata: {name: w, namespace: default}\nspec: {policy: {trafficShift: {destinations: [{weight: 120, kubeService: {name: r, namespace: b, clusterName: c}}]}}}", "should be less than or equal to 100"},
			{"percentage over 100", tps, "apiVersion: networking.relaymesh.io/v1alpha1\nkind: TrafficPolicy\nmetadata: {name: p, namespace: default}\nspec: {policy: {faultInjection: {abort: {httpStatus: 503}, percentage: 100.5}}}", "should be less than or equal to 100"},
			{"delay and abort", tps, "apiVersion: networking.relaymesh.io/v1alpha1\nkind: TrafficPolicy\nmetadata: {name: da, namespace: default}\nspec: {policy: {faultInjection: {fixedDelay: 1s, abort: {httpStatus: 503}, percentage: 1}}}", "exactly one of fixedDelay or abort"},
			{"port out of range", aps, "apiVersion: networking.relaymesh.io/v1alpha1\nkind: AccessPolicy\nmetadata: {name: port, namespace: default}\nspec: {allowedPorts: [70000]}", "should be less than or equal to 65535"},
			{"spiffeIDs and service accounts in one entry", aps, ap + "spec: {sourceSelector: [{spiffeIDs: ['spiffe://spire.example/a'], kubeServiceAccountRefs: {serviceAccounts: [{name: a, namespace: b, clusterName: c}]}}]}", "exactly one of kubeIdentityMatcher, kubeServiceAccountRefs or spiffeIDs"},
			{"an empty source entry", aps, ap + "spec: {sourceSelector: [{}]}", "exactly one of kubeIdentityMatcher, kubeServiceAccountRefs or spiffeIDs"},
			{"a spiffeID with a wildcard", aps, ap + "spec: {sourceSelector: [{spiffeIDs: ['spiffe://spire.example/ns/*']}]}", "should match"},
			{"a spiffeID of a whole trust domain", aps, ap + "spec: {sourceSelector: [{spiffeIDs: ['spiffe://spire.example']}]}", "should match"},
			{"a spiffeID that is no SPIFFE ID", aps, ap + "spec: {sourceSelector: [{spiffeIDs: ['https://spire.example/a']}]}", "should match"},
			{"no spiffeIDs", aps, ap + "spec: {sourceSelector: [{spiffeIDs: []}]}", "should have at least 1 items"},
			{"a foreign trust domain with capitals in a VirtualMesh", vms, "apiVersion: networking.relaymesh.io/v1alpha1\nkind: VirtualMesh\nmetadata: {name: v, namespace: default}\nspec: {meshes: [{clusterName: c, namespace: istio-system, name: istiod}], mtls: {federatedTrustDomains: [Spire.Example]}}", "should match"},
			{"unknown method", aps, "apiVersion: networking.relaymesh.io/v1alpha1\nkind: AccessPolicy\nmetadata: {name: m, namespace: default}\nspec: {allowedMethods: [STEAL]}", "Unsupported value"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				u := object(t, tt.y)
				_, err := tt.ri.Create(ctx, u, metav1.CreateOptions{})
				require.Error(t, err)
				assert.True(t, apierrors.IsInvalid(err), "got %v", err)
				assert.Contains(t, err.Error(), tt.want)
				_, err = tt.ri.Get(ctx, u.GetName(), metav1.GetOptions{})
				assert.True(t, apierrors.IsNotFound(err), "rejected object must not exist")
			})
		}
	})

	t.Run("no short name is served twice, with Istio's CRDs installed", func(t *testing.T) {
		cs, err := mgmt.Clientset()
		require.NoError(t, err)
		lists, err := cs.Discovery().ServerPreferredResources()
		require.NoError(t, err)
		// A short name must name one resource: the same plural in two
		// groups (core and events.k8s.io events) is one kind to kubectl.
		owners := map[string]map[string][]string{} // short name -> plural -> groups
		names := map[string][]string{}             // plural or singular name -> groups
		var ours []string
		for _, l := range lists {
			gv, err := schema.ParseGroupVersion(l.GroupVersion)
			require.NoError(t, err)
			for _, r := range l.APIResources {
				if strings.Contains(r.Name, "/") {
					continue // a subresource
				}
				names[r.Name] = append(names[r.Name], gv.Group)
				for _, sn := range r.ShortNames {
					if owners[sn] == nil {
						owners[sn] = map[string][]string{}
					}
					owners[sn][r.Name] = append(owners[sn][r.Name], gv.Group)
					if strings.HasSuffix(gv.Group, "relaymesh.io") {
						ours = append(ours, sn)
					}
				}
			}
		}
		require.NotEmpty(t, owners["ap"], "Istio's CRDs are served (AuthorizationPolicy is ap)")
		require.Len(t, ours, 6, "every user-facing Relaymesh kind has a short name: %v", ours)
		for sn, byName := range owners {
			assert.Len(t, byName, 1, "short name %q names %v", sn, byName)
		}
		for _, sn := range ours {
			assert.True(t, strings.HasPrefix(sn, "rm"), "%q: Relaymesh's short names start with rm, clear of other projects' (KubeVirt's vm)", sn)
			assert.Empty(t, names[sn], "short name %q is another resource's name", sn)
		}

		// kubectl resolves Istio's ap without a warning, and Relaymesh's own.
		kubectl := filepath.Join(repoRoot(t), ".cache", "bin", "kubectl")
		for _, args := range [][]string{{"get", "ap", "-A"}, {"get", "rmap,rmtp,rmvm,rmvd,rmkc", "-A"}} {
			out, err := runKubectl(kubectl, mgmt.Kubeconfig, args...)
			require.NoError(t, err, "kubectl %v: %s", args, out)
			assert.NotContains(t, out, "Warning", "kubectl %v", args)
		}
	})

	t.Run("kubectl shows a readable certificate expiry", func(t *testing.T) {
		clusters := dyn.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace("default")
		expiry := time.Now().Add(23 * time.Hour).UTC().Truncate(time.Second)
		patch := fmt.Sprintf(`{"status": {"connected": true, "replica": "server-0", "lastSeen": %q, "agentCertificate": {"serial": "0a", "spiffeID": "spiffe://relaymesh.local/cluster/cluster-1/agent", "notAfter": %q}}}`,
			time.Now().UTC().Format(time.RFC3339), expiry.Format(time.RFC3339))
		_, err := clusters.Patch(ctx, "cluster-1", "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}, "status")
		require.NoError(t, err)
		kubectl := filepath.Join(repoRoot(t), ".cache", "bin", "kubectl")
		out, err := runKubectl(kubectl, mgmt.Kubeconfig, "get", "kubernetesclusters", "-n", "default", "-o", "wide")
		require.NoError(t, err, out)
		t.Logf("kubectl get kubernetesclusters -o wide:\n%s", out)
		assert.NotContains(t, out, "<invalid>")
		assert.Regexp(t, `(?m)^NAME\s+MODE\s+CONNECTED\s+LAST EVENT\s+CERT EXPIRES\s+REPLICA`, out)
		assert.Regexp(t, `(?m)^cluster-1\s+relay\s+true\s+\S+\s+`+regexp.QuoteMeta(expiry.Format(time.RFC3339))+`\s+server-0`, out)
	})

	t.Run("valid VirtualService is accepted", func(t *testing.T) {
		_, err := vss.Create(ctx, object(t, validVirtualService), metav1.CreateOptions{})
		require.NoError(t, err)
	})

	t.Run("VirtualService with a bad field is rejected", func(t *testing.T) {
		u := object(t, validVirtualService)
		u.SetName("bad-type")
		require.NoError(t, unstructured.SetNestedField(u.Object, "reviews", "spec", "hosts"))
		_, err := vss.Create(ctx, u, metav1.CreateOptions{})
		require.Error(t, err)
		assert.True(t, apierrors.IsInvalid(err), "got %v", err)
		assert.Contains(t, err.Error(), "spec.hosts")

		u = object(t, strings.Replace(validVirtualService, "- route:", "- retriez: {attempts: 3}\n    route:", 1))
		u.SetName("unknown-field")
		_, err = vss.Create(ctx, u, metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "retriez")
	})

	t.Run("clusters are isolated", func(t *testing.T) {
		c1, err := env.Cluster("cluster-1").Clientset()
		require.NoError(t, err)
		c2, err := env.Cluster("cluster-2").Clientset()
		require.NoError(t, err)
		_, err = c1.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "only-in-1"}}, metav1.CreateOptions{})
		require.NoError(t, err)
		_, err = c2.CoreV1().Namespaces().Get(ctx, "only-in-1", metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "cluster-2 sees cluster-1's namespace: %v", err)
	})

	t.Run("service-account tokens work", func(t *testing.T) {
		cs, err := env.Cluster("cluster-1").Clientset()
		require.NoError(t, err)
		_, err = cs.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "istiod"}}, metav1.CreateOptions{})
		require.NoError(t, err)
		tr, err := cs.CoreV1().ServiceAccounts("default").CreateToken(ctx, "istiod", &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"istio-ca"}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		review, err := cs.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
			Spec: authenticationv1.TokenReviewSpec{Token: tr.Status.Token, Audiences: []string{"istio-ca"}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		assert.True(t, review.Status.Authenticated, "token of cluster-1 rejected by cluster-1: %s", review.Status.Error)
		assert.Equal(t, "system:serviceaccount:default:istiod", review.Status.User.Username)

		other, err := env.Cluster("cluster-2").Clientset()
		require.NoError(t, err)
		review, err = other.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
			Spec: authenticationv1.TokenReviewSpec{Token: tr.Status.Token, Audiences: []string{"istio-ca"}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		assert.False(t, review.Status.Authenticated, "cluster-2 must not accept cluster-1's token")
	})

	t.Run("kubeconfigs work", func(t *testing.T) {
		for _, c := range env.Clusters() {
			assert.FileExists(t, c.Kubeconfig)
		}
	})
}

func TestDetachedUpDown(t *testing.T) {
	SkipIfShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "env")
	env, err := Start(ctx, Config{Dir: dir, Clusters: []string{"solo"}, Detach: true})
	require.NoError(t, err)
	pids := env.Pids()
	t.Cleanup(func() { _ = env.Stop() }) // only acts if Down failed
	assert.FileExists(t, filepath.Join(dir, stateFile))
	assert.FileExists(t, filepath.Join(dir, "solo.kubeconfig"))

	require.NoError(t, Down(dir))
	deadline := time.Now().Add(15 * time.Second)
	for _, pid := range pids {
		for Alive(pid) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		assert.False(t, Alive(pid), "process %d survived Down", pid)
	}
	assert.NoDirExists(t, dir)
}

// TestRestartWhileItsPortsAreTakenOn127001: etcd and the API servers
// listen on the environment's own loopback address, so a socket on the
// same port of 127.0.0.1 (an outgoing connection to loopback leaves from
// there, with an ephemeral port that can be theirs) keeps neither from
// starting again after a crash. Before, they listened on 127.0.0.1 and the
// restart failed with "bind: address already in use".
func TestRestartWhileItsPortsAreTakenOn127001(t *testing.T) {
	env := startEnv(t, false, "solo")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := env.Cluster("solo")
	u, err := url.Parse(c.URL)
	require.NoError(t, err)
	apiserver := netip.MustParseAddrPort(u.Host)
	require.True(t, apiserver.Addr().IsLoopback(), "%s", c.URL)
	require.NotEqual(t, "127.0.0.1", apiserver.Addr().String(), "the environment's own address (this machine routes 127.0.0.0/8 to lo)")
	etcdClient, err := clientAddr(env.etcd.cmd.Args)
	require.NoError(t, err)
	etcd := netip.MustParseAddrPort(etcdClient)
	assert.Equal(t, apiserver.Addr(), etcd.Addr(), "etcd listens on the same address")
	var etcdPeer netip.AddrPort
	for _, a := range env.etcd.cmd.Args {
		if v, ok := strings.CutPrefix(a, "--listen-peer-urls="); ok {
			pu, err := url.Parse(v)
			require.NoError(t, err)
			etcdPeer = netip.MustParseAddrPort(pu.Host)
		}
	}
	assert.Equal(t, apiserver.Addr(), etcdPeer.Addr(), "etcd's peer port too")

	// What the design rests on: a connection to the environment's address
	// leaves from 127.0.0.1, so no source port is taken from it.
	conn, err := net.Dial("tcp", u.Host)
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1", conn.LocalAddr().(*net.TCPAddr).IP.String())
	require.NoError(t, conn.Close())

	// The certificates name the address: the admin client verifies it.
	cs, err := c.Clientset()
	require.NoError(t, err)
	_, err = cs.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
	require.NoError(t, err)

	taken := 0
	for _, port := range []uint16{apiserver.Port(), etcd.Port(), etcdPeer.Port()} {
		l, err := net.Listen("tcp", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port).String())
		if err != nil {
			continue // in use on 127.0.0.1 already: as good for this test
		}
		taken++
		t.Cleanup(func() { _ = l.Close() })
	}
	require.Positive(t, taken, "at least one of the ports is held on 127.0.0.1 through the restart")

	down, err := env.Restart(ctx, "solo", true)
	require.NoError(t, err)
	assert.Positive(t, down)
	_, err = cs.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
	require.NoError(t, err, "the API server answers at its URL after the restart")
}

// BenchmarkStart measures how long one environment takes from nothing to
// ready API servers with every CRD established, the fixed cost each
// integration test package pays.
func BenchmarkStart(b *testing.B) {
	for _, n := range []int{1, 3} {
		names := []string{"mgmt", "cluster-1", "cluster-2"}[:n]
		b.Run(fmt.Sprintf("clusters=%d", n), func(b *testing.B) {
			for b.Loop() {
				env, err := Start(context.Background(), Config{Dir: b.TempDir(), Clusters: names})
				if err != nil {
					b.Fatal(err)
				}
				if err := env.Stop(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// repoRoot is the checkout the tests run in.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := RepoRoot()
	require.NoError(t, err)
	return root
}

// runKubectl runs kubectl against kubeconfig and returns its stdout and
// stderr together.
func runKubectl(kubectl, kubeconfig string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, kubectl, append([]string{"--kubeconfig", kubeconfig}, args...)...).CombinedOutput()
	return string(out), err
}

// A cluster started after the process's first gets the CRDs from the
// records the first's API server stored (the same UIDs: copied, not
// created again), and its API server serves each of them established and
// with its schema: defaults applied, invalid objects refused.
func TestLaterClustersServeTheCRDsTheFirstStored(t *testing.T) {
	first := startEnv(t, false, "first")
	crds, err := loadCRDs()
	require.NoError(t, err)
	root, err := RepoRoot()
	require.NoError(t, err)
	crdSeed.Lock()
	kept := len(crdSeed.records[filepath.Join(root, ".cache", "bin")])
	crdSeed.Unlock()
	require.Equal(t, len(crds), kept, "a start keeps every CRD's record for the next")

	later := startEnv(t, false, "later-1", "later-2")
	uids := func(c *Cluster) map[string]string {
		cs, err := apiextensionsclient.NewForConfig(c.RESTConfig())
		require.NoError(t, err)
		list, err := cs.ApiextensionsV1().CustomResourceDefinitions().List(context.Background(), metav1.ListOptions{})
		require.NoError(t, err)
		out := map[string]string{}
		for i := range list.Items {
			crd := &list.Items[i]
			assert.True(t, established(crd), "%s in %s", crd.Name, c.Name)
			out[crd.Name] = string(crd.UID)
		}
		return out
	}
	want := uids(first.Cluster("first"))
	require.Len(t, want, len(crds))
	for _, c := range later.Clusters() {
		assert.Equal(t, want, uids(c), "%s's CRDs are the first cluster's records", c.Name)
		dyn, err := dynamic.NewForConfig(c.RESTConfig())
		require.NoError(t, err)
		vms := dyn.Resource(virtualMeshGVR).Namespace("default")
		got, err := vms.Create(context.Background(), object(t, validVirtualMesh), metav1.CreateOptions{})
		require.NoError(t, err, c.Name)
		rs, _, _ := unstructured.NestedString(got.Object, "spec", "mtls", "rotationStrategy")
		assert.Equal(t, "MultiRoot", rs, "%s applies the schema's defaults", c.Name)
		bad := object(t, validVirtualMesh)
		bad.SetName("bad")
		require.NoError(t, unstructured.SetNestedField(bad.Object, "Sometimes", "spec", "globalAccessPolicy"))
		_, err = vms.Create(context.Background(), bad, metav1.CreateOptions{})
		assert.True(t, apierrors.IsInvalid(err), "%s refuses what the schema refuses: %v", c.Name, err)
		_, err = dyn.Resource(virtualServiceGVR).Namespace("default").List(context.Background(), metav1.ListOptions{})
		assert.NoError(t, err, "%s serves Istio's kinds", c.Name)
	}
}

// A start's retry reads only its own attempt's part of the appended log:
// an earlier attempt's lost port is not this attempt's.
func TestPortTakenReadsOnlyThisAttempt(t *testing.T) {
	log := filepath.Join(t.TempDir(), "apiserver.log")
	assert.False(t, PortTaken(log, LogSize(log)), "no log yet")
	require.NoError(t, os.WriteFile(log, []byte("E1207 listen tcp 127.0.0.1:40001: bind: address already in use\n"), 0o600))
	assert.True(t, PortTaken(log, 0), "the first attempt lost its port")
	second := LogSize(log)
	f, err := os.OpenFile(log, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString("E1207 etcd: connection refused\n")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	assert.False(t, PortTaken(log, second), "the second attempt failed for another reason")
	assert.False(t, PortTaken(log, second+1<<20), "an offset past the end")
}
