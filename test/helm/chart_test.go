package helm

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/test/localcluster"
)

// The Prometheus Operator release whose ServiceMonitor CRD the production
// values' ServiceMonitor is applied against.
const prometheusOperator = "github.com/prometheus-operator/prometheus-operator@v0.85.0"

// variants are the values each chart is rendered with: its defaults and
// its documented production file.
func variants(t testing.TB, chart string) map[string][]string {
	v := map[string][]string{
		"defaults":   nil,
		"production": {"-f", filepath.Join(chartDir(t, chart), "values-production.yaml")},
	}
	if chart == serverChart {
		v["redis"] = redisValues
	}
	if chart == agentChart {
		v["ambient-federation"] = ambientFederationValues
	}
	return v
}

// ambientFederationValues let the agent apply ambient federation's
// objects (and grant it the kinds).
var ambientFederationValues = []string{"--set", "ambientFederation.enabled=true"}

// redisValues keep the server's snapshots in the chart's own Redis.
var redisValues = []string{"--set", "snapshotStore.type=redis,snapshotStore.redis.passwordSecret=redis-password,snapshotStore.redis.caConfigMap=redis-ca," +
	"redis.enabled=true,redis.passwordSecret=redis-password,redis.tlsSecret=redis-tls"}

// TestLint: helm lint --strict is clean for both charts, with their
// defaults and their production values.
func TestLint(t *testing.T) {
	h := newHelm(t)
	for _, chart := range []string{serverChart, agentChart} {
		for name, args := range variants(t, chart) {
			out, err := h.run(append([]string{"lint", "--strict", chartDir(t, chart)}, args...)...)
			require.NoError(t, err, "%s %s:\n%s", chart, name, out)
			require.Contains(t, out, "0 chart(s) failed")
		}
	}
}

// TestSchemaRefusesBadValues: values that break a chart's values.schema.json
// are refused by helm template and helm lint with a message that names the
// field.
func TestSchemaRefusesBadValues(t *testing.T) {
	h := newHelm(t)
	cases := []struct {
		chart, values, want string
	}{
		{serverChart, "replicas: 10", "/replicas"},
		{serverChart, "replica: 1", "additional properties 'replica' not allowed"},
		{serverChart, "webhook: {failurePolicy: Maybe}", "/webhook/failurePolicy"},
		{serverChart, "debug: {enabled: authenticated}", "/debug/enabled"},
		{serverChart, "agentCertTTL: 1 day", "/agentCertTTL"},
		{serverChart, "image: {repository: r, digest: 'sha256:abc'}", "/image/digest"},
		{serverChart, "relayRootRotation: {renewAt: 0.95}", "/relayRootRotation/renewAt"},
		{serverChart, "relayRootRotation: {renewAt: 0.05}", "/relayRootRotation/renewAt"},
		{serverChart, "relayRootRotation: {renewAt: '0.9.1'}", "/relayRootRotation/renewAt"},
		{serverChart, "relayRootRotation: {renewAt: true}", "/relayRootRotation/renewAt"},
		{serverChart, "relayRootRotation: {grace: 1 day}", "/relayRootRotation/grace"},
		{serverChart, "relayRootRotation: {grace: '-1h'}", "/relayRootRotation/grace"},
		{serverChart, "relayRootRotation: {start: 0.5}", "additional properties 'start' not allowed"},
		{serverChart, "serverDNSNames: ['Not A Name']", "/serverDNSNames/0"},
		{serverChart, "serverIPs: [relay.example.com]", "/serverIPs/0"},
		{serverChart, "logLevel: verbose", "/logLevel"},
		{serverChart, "extraArgs: ['rm -rf /']", "/extraArgs/0"},
		{serverChart, "resources: {requests: {cpu: [1]}}", "/resources/requests/cpu"},
		{serverChart, "allowSharedToken: 'yes'", "/allowSharedToken"},
		{serverChart, "snapshotStore: {type: mongodb}", "/snapshotStore/type"},
		{serverChart, "snapshotStore: {type: redis, redis: {caConfigMap: ca}}", "/snapshotStore/redis"},
		{serverChart, "snapshotStore: {type: redis, redis: {address: 'redis', passwordSecret: p, caConfigMap: ca}}", "/snapshotStore/redis/address"},
		{serverChart, "redis: {enabled: true, passwordSecret: p}", "/tlsSecret"},
		{serverChart, "dashboard: {audience: 'relaymesh-dashboard,istio-ca'}", "/dashboard/audience"},
		{serverChart, "dashboard: {tls: {secretName: Dashboard_TLS}}", "/dashboard/tls/secretName"},
		{serverChart, "dashboard: {tls: {cert: x}}", "additional properties 'cert' not allowed"},
		{serverChart, "dashboard: {session: {idleTimeout: 30}}", "/dashboard/session/idleTimeout"},
		{serverChart, "spiffeBundle: {peerPoll: 30 min}", "/spiffeBundle/peerPoll"},
		{serverChart, "spiffeBundle: {endpointID: 'https://c1.local/relaymesh/bundle-endpoint'}", "/spiffeBundle/endpointID"},
		{serverChart, "spiffeBundle: {endpointID: 'spiffe://c1.local'}", "/spiffeBundle/endpointID"},
		{serverChart, "spiffeBundle: {spiffePort: 70000}", "/spiffeBundle/spiffePort"},
		{agentChart, "replicas: 0", "/replicas"},
		{agentChart, "replicaCount: 11", "/replicaCount"},
		{serverChart, "replicaCount: 0", "/replicaCount"},
		{serverChart, "serviceAccount: {create: false}", "/serviceAccount/name"},
		{agentChart, "serviceAccount: {create: false}", "/serviceAccount/name"},
		{serverChart, "fullnameOverride: 9-starts-with-a-digit", "/fullnameOverride"},
		{agentChart, "nameOverride: Not_A_Label", "/nameOverride"},
		{agentChart, "serverAddress: no-port", "/serverAddress"},
		{agentChart, "cluster: Cluster_1", "/cluster"},
		{agentChart, "leaderElection: {leaseName: l, leaseDuration: 15, renewDeadline: 10s, retryPeriod: 2s}", "/leaderElection/leaseDuration"},
		{agentChart, "autoRestartPods: 1", "/autoRestartPods"},
		{agentChart, "ambientFederation: {enabled: yes-please}", "/ambientFederation/enabled"},
		{agentChart, "ambientFederation: {enable: true}", "additional properties 'enable' not allowed"},
		{agentChart, "networkPolicy: {enabled: true, from: []}", "additional properties 'from' not allowed"},
	}
	for _, c := range cases {
		t.Run(c.chart+"/"+c.values, func(t *testing.T) {
			f := valuesFile(t, c.values+"\n")
			_, err := h.template(chartDir(t, c.chart), "r", namespace, "-f", f)
			require.Error(t, err)
			require.Contains(t, err.Error(), "values don't meet the specifications of the schema")
			require.Contains(t, err.Error(), c.want)
			out, err := h.run("lint", "--strict", chartDir(t, c.chart), "-f", f)
			require.Error(t, err, out)
			require.Contains(t, out+err.Error(), c.want)
		})
	}
}

// TestRelayRootRotationValuesBecomeServerFlags: the relay root rotation's
// knobs reach the server as flags only when set (unset: the server's
// defaults, 2/3 and the least grace), 0 included (no automatic start),
// from a values file or --set (which passes a fraction as a string).
func TestRelayRootRotationValuesBecomeServerFlags(t *testing.T) {
	h := newHelm(t)
	for _, c := range []struct {
		args []string
		want []string
	}{
		{nil, nil},
		{[]string{"--set", "relayRootRotation.renewAt=0"}, []string{"--relay-root-renew-at=0"}},
		{[]string{"--set", "relayRootRotation.renewAt=0.5,relayRootRotation.grace=48h"}, []string{"--relay-root-renew-at=0.5", "--relay-root-grace=48h"}},
		{[]string{"-f", valuesFile(t, "relayRootRotation: {renewAt: 0.75, grace: 30h}\n")}, []string{"--relay-root-renew-at=0.75", "--relay-root-grace=30h"}},
		{[]string{"-f", valuesFile(t, "relayRootRotation: {grace: ''}\n")}, nil},
	} {
		objs, err := h.template(chartDir(t, serverChart), "r", namespace, c.args...)
		require.NoError(t, err, "%v", c.args)
		assert.Equal(t, c.want, argsWithPrefix(t, objs, "--relay-root-"), "%v", c.args)
	}
}

// argsWithPrefix are the server container's arguments that start with
// prefix, in order.
func argsWithPrefix(t *testing.T, objs []*unstructured.Unstructured, prefix string) []string {
	t.Helper()
	var got []string
	for _, a := range containerArgs(t, objs) {
		if strings.HasPrefix(a, prefix) {
			got = append(got, a)
		}
	}
	return got
}

// TestSPIFFEBundleValuesBecomeServerFlagsAndPorts: the bundle endpoint's
// knobs reach the server as flags, and https_spiffe (endpointID) adds its
// flags, container port and Service port only when set.
func TestSPIFFEBundleValuesBecomeServerFlagsAndPorts(t *testing.T) {
	h := newHelm(t)
	for _, c := range []struct {
		args  []string
		want  []string
		ports int // Service ports named spiffe-bundle*
	}{
		{nil, nil, 0},
		{[]string{"--set", "spiffeBundle.enabled=true"}, []string{"--spiffe-bundle-listen=:8443", "--spiffe-bundle-refresh-hint=5m", "--spiffe-bundle-peer-poll=30m"}, 1},
		{[]string{"--set", "spiffeBundle.enabled=true,spiffeBundle.peerPoll=0s,spiffeBundle.endpointID=spiffe://c1.local/relaymesh/bundle-endpoint"},
			[]string{"--spiffe-bundle-listen=:8443", "--spiffe-bundle-refresh-hint=5m", "--spiffe-bundle-peer-poll=0s",
				"--spiffe-bundle-spiffe-listen=:8444", "--spiffe-bundle-endpoint-id=spiffe://c1.local/relaymesh/bundle-endpoint"}, 2},
	} {
		objs, err := h.template(chartDir(t, serverChart), "r", namespace, c.args...)
		require.NoError(t, err, "%v", c.args)
		assert.Equal(t, c.want, argsWithPrefix(t, objs, "--spiffe-bundle-"), "%v", c.args)
		ports := 0
		for _, o := range objs {
			if o.GetKind() != "Service" {
				continue
			}
			list, _, _ := unstructured.NestedSlice(o.Object, "spec", "ports")
			for _, p := range list {
				if name, _ := p.(map[string]any)["name"].(string); strings.HasPrefix(name, "spiffe-bundle") {
					ports++
				}
			}
		}
		assert.Equal(t, c.ports, ports, "%v: Service ports", c.args)
	}
}

// TestTemplatesRefuseWithAMessage: rules across fields that a JSON schema
// can only report as a failed branch are the templates' own, and their
// messages say what to set.
func TestTemplatesRefuseWithAMessage(t *testing.T) {
	h := newHelm(t)
	for _, c := range []struct{ values, want string }{
		{"webhook: {enabled: true}", "webhook.enabled=true needs webhook.clientCAConfigMap: a ConfigMap of the release namespace"},
		{"webhook: {enabled: true, clientCAConfigMap: ca, allowUnauthenticated: true}", "set either webhook.clientCAConfigMap"},
	} {
		t.Run(c.values, func(t *testing.T) {
			f := valuesFile(t, c.values+"\n")
			_, err := h.template(chartDir(t, serverChart), "r", namespace, "-f", f)
			require.Error(t, err)
			require.Contains(t, err.Error(), c.want)
			require.NotContains(t, err.Error(), "oneOf")
		})
	}
}

// TestCRDsAreTheAPIs: the server chart's crds/ is exactly api/crds (make
// gen copies them; make verify fails when they differ).
func TestCRDsAreTheAPIs(t *testing.T) {
	api, err := filepath.Glob(filepath.Join(repoRoot(t), "api", "crds", "*.yaml"))
	require.NoError(t, err)
	chart, err := filepath.Glob(filepath.Join(chartDir(t, serverChart), "crds", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, api)
	require.Len(t, chart, len(api))
	for _, p := range api {
		want, err := os.ReadFile(p)
		require.NoError(t, err)
		got, err := os.ReadFile(filepath.Join(chartDir(t, serverChart), "crds", filepath.Base(p)))
		require.NoError(t, err, "run make gen")
		require.True(t, bytes.Equal(want, got), "%s differs from api/crds: run make gen", filepath.Base(p))
	}
}

// TestNoChartOwnedSecrets: no values of either chart render a Secret, so no
// helm upgrade or uninstall can delete or regenerate a key; and both charts
// default to the image `make image` builds.
func TestNoChartOwnedSecrets(t *testing.T) {
	h := newHelm(t)
	prod := func(chart string) []string { return variants(t, chart)["production"] }
	for chart, argSets := range map[string][][]string{
		serverChart: {nil, prod(serverChart), redisValues, {"--set", "caSecret=provided"}, {"--set", "allowSharedToken=true,allowKubeconfigClusters=true"}, {"--set", "debug.enabled=false"}, {"--set", "webhook.enabled=true,webhook.allowUnauthenticated=true"}},
		agentChart:  {nil, prod(agentChart), {"--set", "autoRestartPods=true"}, ambientFederationValues, {"--set", "cluster=c1,serverAddress=relay.example.com:9900"}},
	} {
		for _, args := range argSets {
			objs, err := h.template(chartDir(t, chart), chart, namespace, args...)
			require.NoError(t, err)
			for _, o := range objs {
				assert.NotEqual(t, "Secret", o.GetKind(), "%s %v renders Secret %s", chart, args, o.GetName())
			}
		}
		objs, err := h.template(chartDir(t, chart), chart, namespace)
		require.NoError(t, err)
		d := convert[appsv1.Deployment](t, find(t, objs, "Deployment"))
		meta, err := os.ReadFile(filepath.Join(chartDir(t, chart), "Chart.yaml"))
		require.NoError(t, err)
		var c struct {
			AppVersion string `json:"appVersion"`
		}
		require.NoError(t, yaml.Unmarshal(meta, &c))
		assert.Equal(t, "ghcr.io/relaymesh/relaymesh:"+c.AppVersion, d.Spec.Template.Spec.Containers[0].Image,
			"%s: the image make image names (tools/image --repository, VERSION from appVersion)", chart)
	}
}

// TestChartsOnARealAPIServer: everything both charts render, with defaults
// and with the production values, is server-side applied (not a dry run)
// to a real kube-apiserver with the Relaymesh CRDs and the Prometheus
// Operator's ServiceMonitor CRD; Pods built from both Deployments are
// admitted by a namespace enforcing Pod Security "restricted" (and a Pod
// that breaks it is refused, so the check is on); a helm install with bad
// values changes nothing.
func TestChartsOnARealAPIServer(t *testing.T) {
	localcluster.SkipIfShort(t)
	ctx := context.Background()
	start := time.Now()
	env, err := localcluster.Start(ctx, localcluster.Config{Dir: t.TempDir(), Clusters: []string{"charts"}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, env.Stop()) })
	c := env.Cluster("charts")
	cs, err := c.Clientset()
	require.NoError(t, err)
	_, err = c.Apply(ctx, "test", serviceMonitorCRD(t))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := cs.Discovery().ServerResourcesForGroupVersion("monitoring.coreos.com/v1")
		return err == nil
	}, 30*time.Second, 100*time.Millisecond, "ServiceMonitor CRD served")
	_, err = cs.CoreV1().Namespaces().Create(ctx, namespaceObject("restricted", map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}), metav1.CreateOptions{})
	require.NoError(t, err)
	h := newHelm(t)

	for _, chart := range []string{serverChart, agentChart} {
		for variant, args := range variants(t, chart) {
			t.Run(chart+"/"+variant, func(t *testing.T) {
				ns := strings.TrimPrefix(chart, "relaymesh-") + "-" + variant
				_, err := cs.CoreV1().Namespaces().Create(ctx, namespaceObject(ns, nil), metav1.CreateOptions{})
				require.NoError(t, err)
				objs, err := h.template(chartDir(t, chart), chart, ns, args...)
				require.NoError(t, err)
				manifest := encode(t, objs)
				applied, err := c.Apply(ctx, "helm-test", manifest)
				require.NoError(t, err, "server-side apply of %s %s", chart, variant)
				require.Len(t, applied, len(objs))
				kinds := map[string]bool{}
				for _, o := range applied {
					kinds[o.GetKind()] = true
					require.NotEmpty(t, o.GetUID(), "%s %s stored", o.GetKind(), o.GetName())
				}
				for _, k := range []string{"ServiceAccount", "Deployment", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "PodDisruptionBudget", "NetworkPolicy"} {
					require.True(t, kinds[k], "%s %s renders a %s", chart, variant, k)
				}
				require.True(t, kinds["ValidatingAdmissionPolicy"] && kinds["ValidatingAdmissionPolicyBinding"])
				if chart == serverChart {
					require.True(t, kinds["Service"])
					require.Equal(t, variant == "production", kinds["ServiceMonitor"])
				}

				// Each Deployment's pod, as a kubelet-less cluster admits it.
				objs, err = h.template(chartDir(t, chart), chart, "restricted", args...)
				require.NoError(t, err)
				var sas []*unstructured.Unstructured
				for _, o := range objs {
					if o.GetKind() == "ServiceAccount" {
						sas = append(sas, o)
					}
				}
				_, err = c.Apply(ctx, "helm-test", encode(t, sas))
				require.NoError(t, err)
				var pod *corev1.Pod
				for _, o := range objs {
					if o.GetKind() != "Deployment" {
						continue
					}
					p := podOf(t, o, "restricted", chart+"-"+variant+"-"+o.GetName())
					_, err = cs.CoreV1().Pods("restricted").Create(ctx, p, metav1.CreateOptions{})
					require.NoError(t, err, "Pod Security restricted admits the %s pod (%s)", o.GetName(), variant)
					if pod == nil {
						pod = p
					}
				}

				bad := pod.DeepCopy()
				bad.Name += "-privileged"
				bad.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = new(true)
				bad.Spec.Containers[0].SecurityContext.Capabilities = nil
				_, err = cs.CoreV1().Pods("restricted").Create(ctx, bad, metav1.CreateOptions{})
				require.Error(t, err, "the namespace enforces restricted")
				require.Contains(t, err.Error(), `violates PodSecurity "restricted:latest"`)
			})
		}
	}

	t.Run("ambient federation's rules apply its objects, and only with the value", func(t *testing.T) {
		ambientFederationRBAC(ctx, t, c)
	})
	t.Run("bad values change nothing", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "bad.yaml")
		require.NoError(t, os.WriteFile(f, []byte("webhook: {failurePolicy: Maybe}\n"), 0o600))
		_, err := h.run("install", "bad", chartDir(t, serverChart), "--namespace", "bad", "--create-namespace", "--kubeconfig", c.Kubeconfig, "-f", f)
		require.Error(t, err)
		require.Contains(t, err.Error(), "/webhook/failurePolicy")
		_, err = cs.CoreV1().Namespaces().Get(ctx, "bad", metav1.GetOptions{})
		require.True(t, apierrors.IsNotFound(err), "nothing created: %v", err)
		out, err := h.run("list", "--all-namespaces", "--kubeconfig", c.Kubeconfig, "-q")
		require.NoError(t, err)
		require.Empty(t, strings.TrimSpace(out), "no release recorded")
	})
	t.Run("the keys every Helm user types", func(t *testing.T) {
		// helm install with replicaCount, fullnameOverride and an existing
		// ServiceAccount, then nameOverride: both charts install, and the
		// objects carry what was asked.
		for _, chart := range []string{serverChart, agentChart} {
			ns := "keys-" + strings.TrimPrefix(chart, "relaymesh-")
			_, err := cs.CoreV1().Namespaces().Create(ctx, namespaceObject(ns, nil), metav1.CreateOptions{})
			require.NoError(t, err)
			_, err = cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "existing"}}, metav1.CreateOptions{})
			require.NoError(t, err)
			out, err := h.run("install", chart, chartDir(t, chart), "--namespace", ns, "--kubeconfig", c.Kubeconfig,
				"--set", "replicaCount=3", "--set", "fullnameOverride=x", "--set", "serviceAccount.create=false", "--set", "serviceAccount.name=existing")
			require.NoError(t, err, "%s: %s", chart, out)
			objs, err := h.manifest(c.Kubeconfig, chart, ns)
			require.NoError(t, err)
			for _, o := range objs {
				assert.NotEqual(t, "ServiceAccount", o.GetKind(), "%s: serviceAccount.create=false renders none", chart)
			}
			d, err := cs.AppsV1().Deployments(ns).Get(ctx, "x", metav1.GetOptions{})
			require.NoError(t, err, "%s: the Deployment is named by fullnameOverride", chart)
			assert.Equal(t, int32(3), *d.Spec.Replicas, "%s: replicaCount", chart)
			assert.Equal(t, "existing", d.Spec.Template.Spec.ServiceAccountName, chart)
			assert.Equal(t, chart, d.Spec.Template.Labels["app.kubernetes.io/name"], "%s: the label the CLI finds pods by stays", chart)
			rb, err := cs.RbacV1().RoleBindings(ns).Get(ctx, "x", metav1.GetOptions{})
			require.NoError(t, err, chart)
			require.Len(t, rb.Subjects, 1)
			assert.Equal(t, "existing", rb.Subjects[0].Name, "%s: the Role is bound to the existing account", chart)
			if chart == serverChart {
				_, err := cs.CoreV1().Services(ns).Get(ctx, "x", metav1.GetOptions{})
				require.NoError(t, err, "the Service is named by fullnameOverride")
				assert.Contains(t, out, "--server-service x", "NOTES say how the CLI finds the renamed Service")
				assert.NotContains(t, out, "ClusterIP Service", "NOTES do not say agents dial a ClusterIP")
				assert.Contains(t, out, "A ClusterIP is reachable only from inside this cluster")
			}

			// nameOverride: RELEASE-NAME, created ServiceAccount of that name.
			release := chart + "-named"
			out, err = h.run("install", release, chartDir(t, chart), "--namespace", ns, "--kubeconfig", c.Kubeconfig, "--set", "nameOverride=renamed", "--set", "replicaCount=1")
			require.NoError(t, err, "%s: %s", chart, out)
			d, err = cs.AppsV1().Deployments(ns).Get(ctx, release+"-renamed", metav1.GetOptions{})
			require.NoError(t, err, "%s: the Deployment is named RELEASE-nameOverride", chart)
			assert.Equal(t, int32(1), *d.Spec.Replicas)
			assert.Equal(t, release+"-renamed", d.Spec.Template.Spec.ServiceAccountName)
			_, err = cs.CoreV1().ServiceAccounts(ns).Get(ctx, release+"-renamed", metav1.GetOptions{})
			require.NoError(t, err, "%s: the chart's own ServiceAccount", chart)
		}
	})

	t.Run("token records name their minter", func(t *testing.T) {
		// The server chart's admission policy (installed above in
		// keys-server): a bootstrap token record must name the user that
		// creates it, and the name cannot change afterwards.
		const ns = "keys-server"
		me, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		require.NoError(t, err)
		user := me.Status.UserInfo.Username
		require.NotEmpty(t, user)
		record := func(name, minter string) *corev1.Secret {
			s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"relaymesh.io/bootstrap-token": "true"}},
				Type: identity.TokenSecretType, Data: map[string][]byte{"cluster": []byte("c1")}}
			if minter != "" {
				s.Annotations = map[string]string{identity.MintedByAnnotation: minter}
			}
			return s
		}
		secrets := cs.CoreV1().Secrets(ns)
		// The policy takes a moment to be enforced after it is created.
		require.Eventually(t, func() bool {
			_, err := secrets.Create(ctx, record("probe", "someone-else"), metav1.CreateOptions{})
			if err == nil {
				_ = secrets.Delete(ctx, "probe", metav1.DeleteOptions{})
			}
			return err != nil && strings.Contains(err.Error(), "must name its minter")
		}, 30*time.Second, 200*time.Millisecond, "a record naming another user is refused")
		_, err = secrets.Create(ctx, record("unnamed", ""), metav1.CreateOptions{})
		require.Error(t, err, "a record naming no one is refused")
		assert.Contains(t, err.Error(), "annotation relaymesh.io/minted-by must be "+user)
		got, err := secrets.Create(ctx, record("named", user), metav1.CreateOptions{})
		require.NoError(t, err, "a record naming its creator is accepted")
		got.Annotations[identity.MintedByAnnotation] = "someone-else"
		_, err = secrets.Update(ctx, got, metav1.UpdateOptions{})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "cannot be changed")
		// The server marks records audited: an update that keeps the
		// minter passes.
		got, err = secrets.Get(ctx, "named", metav1.GetOptions{})
		require.NoError(t, err)
		got.Annotations["relaymesh.io/audited"] = "true"
		_, err = secrets.Update(ctx, got, metav1.UpdateOptions{})
		require.NoError(t, err)
		// Outside the release namespace the policy does not apply.
		other := record("elsewhere", "")
		other.Namespace = "keys-agent"
		_, err = cs.CoreV1().Secrets("keys-agent").Create(ctx, other, metav1.CreateOptions{})
		require.NoError(t, err)
	})

	t.Logf("charts on a real API server: %s", time.Since(start).Round(time.Millisecond))
}

// podOf is the Pod a ReplicaSet would create from a Deployment's template.
func podOf(t testing.TB, o *unstructured.Unstructured, ns, name string) *corev1.Pod {
	t.Helper()
	d := convert[appsv1.Deployment](t, o)
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: d.Spec.Template.Labels, Annotations: d.Spec.Template.Annotations},
		Spec: d.Spec.Template.Spec}
}

// encode writes objects as a multi-document YAML manifest.
func encode(t testing.TB, objs []*unstructured.Unstructured) []byte {
	t.Helper()
	var b bytes.Buffer
	for _, o := range objs {
		y, err := yaml.Marshal(o.Object)
		require.NoError(t, err)
		b.WriteString("---\n")
		b.Write(y)
	}
	return b.Bytes()
}

// serviceMonitorCRD is the ServiceMonitor CRD of the pinned Prometheus
// Operator release, from the Go module cache (downloaded once through the
// module proxy).
func serviceMonitorCRD(t testing.TB) []byte {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", prometheusOperator)
	cmd.Dir = t.TempDir() // outside any module: no go.mod is changed
	out, err := cmd.Output()
	require.NoError(t, err, "go mod download %s", prometheusOperator)
	var m struct{ Dir string }
	require.NoError(t, json.Unmarshal(out, &m))
	b, err := os.ReadFile(filepath.Join(m.Dir, "example", "prometheus-operator-crd", "monitoring.coreos.com_servicemonitors.yaml"))
	require.NoError(t, err)
	return b
}

// valuesFile writes values into a file whose path holds no comma: helm
// splits -f at commas, and t.TempDir's name is the subtest's (values like
// "{enabled: true, …}").
func valuesFile(t *testing.T, values string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "relaymesh-values-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	f := filepath.Join(dir, "values.yaml")
	require.NoError(t, os.WriteFile(f, []byte(values), 0o600))
	return f
}
