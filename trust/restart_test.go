package trust_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/api/outputs"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Each test's agent has its own Owner, so that pruning (every Apply
// deletes the owner's cacerts it was not asked for) leaves other tests'
// cacerts alone.

// signer answers CSRs from root, with bundle as the root bundle.
func signer(t *testing.T, root *testRoot, bundle []byte) trust.SignFunc {
	return func(_ context.Context, r *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
		return &relaypb.IntermediateResponse{CertificateChain: root.sign(t, r.GetCsr(), 3*time.Hour, nil), RootBundle: bundle, Issuer: trust.Fingerprint(root.cert)}, nil
	}
}

// workloadNamespace creates a namespace with labels; it is deleted after
// the test (without a namespace controller it stays Terminating, which the
// agent skips), so later tests do not wait for its istio-ca-root-cert.
func workloadNamespace(t *testing.T, c kubernetes.Interface, name string, labels map[string]string) string {
	t.Helper()
	_, err := c.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	return name
}

// deployment creates a Deployment; mutate may label or annotate it.
func deployment(t *testing.T, c kubernetes.Interface, ns, name string, mutate func(*appsv1.Deployment)) {
	t.Helper()
	sel := map[string]string{"app": name}
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: sel}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "example.com/app:1"}}}}}}
	if mutate != nil {
		mutate(d)
	}
	_, err := c.AppsV1().Deployments(ns).Create(context.Background(), d, metav1.CreateOptions{})
	require.NoError(t, err)
}

// setRootCert writes a namespace's istio-ca-root-cert, as istiod would.
func setRootCert(t *testing.T, c kubernetes.Interface, ns, rootCertPEM string) {
	t.Helper()
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: trust.RootCertConfigMap, Namespace: ns}, Data: map[string]string{"root-cert.pem": rootCertPEM}}
	_, err := c.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		_, err = c.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
	}
	require.NoError(t, err)
}

// template returns the pod template annotations and the resourceVersion of
// a Deployment.
func template(t *testing.T, c kubernetes.Interface, ns, name string) (map[string]string, string) {
	t.Helper()
	d, err := c.AppsV1().Deployments(ns).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return d.Spec.Template.Annotations, d.ResourceVersion
}

func cacerts(t *testing.T, c kubernetes.Interface, ns string) *corev1.Secret {
	t.Helper()
	s, err := c.CoreV1().Secrets(ns).Get(context.Background(), trust.SecretName, metav1.GetOptions{})
	require.NoError(t, err)
	return s
}

// logLines decodes a JSON log into its records.
func logLines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.Lines(buf.String()) {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec))
		out = append(out, rec)
	}
	return out
}

// After the CA changes the agent restarts istiod first, then the injected
// Deployments of each namespace once its istio-ca-root-cert carries the
// bundle; the same CA state restarts nothing twice; a new one starts over.
func TestRestartPodsAfterCAChange(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	istio := namespace(t, c)
	deployment(t, c, istio, "istiod", nil)
	deployment(t, c, istio, "helper", nil) // istiod's namespace is not injected
	inj := workloadNamespace(t, c, "restart-injected", map[string]string{"istio-injection": "enabled"})
	rev := workloadNamespace(t, c, "restart-revision", map[string]string{"istio.io/rev": "canary"})
	off := workloadNamespace(t, c, "restart-plain", nil)
	disabled := workloadNamespace(t, c, "restart-disabled", map[string]string{"istio-injection": "disabled", "istio.io/rev": "canary"})
	deployment(t, c, inj, "app", nil)
	deployment(t, c, inj, "opt-out", func(d *appsv1.Deployment) {
		d.Spec.Template.Annotations = map[string]string{"sidecar.istio.io/inject": "false"}
	})
	deployment(t, c, inj, "opt-out-label", func(d *appsv1.Deployment) { d.Spec.Template.Labels["sidecar.istio.io/inject"] = "false" })
	deployment(t, c, rev, "app", nil)
	deployment(t, c, off, "app", nil)
	deployment(t, c, disabled, "app", nil)
	old := newRoot(t, "old-root")
	for _, ns := range []string{inj, rev, off, disabled} {
		setRootCert(t, c, ns, string(old.pem))
	}

	root := newRoot(t, "root-1")
	now := time.Now()
	a := &trust.Agent{Client: c, Owner: "restart-after-change", Clock: func() time.Time { return now }}
	req := request(istio, root)
	set := &relaypb.OutputSet{Trust: []*relaypb.TrustRequest{req}}
	apply := func(sign trust.SignFunc, want string) time.Time {
		t.Helper()
		results, next := a.Apply(ctx, set, sign)
		require.Len(t, results, 1)
		require.Equal(t, want, results[0].GetOutcome(), results[0].GetError())
		return next
	}
	restartedFor := func(ns, name string) string {
		t.Helper()
		ann, _ := template(t, c, ns, name)
		return ann[trust.CAStateAnnotation]
	}
	untouched := func(state string) {
		t.Helper()
		for _, d := range [][2]string{{istio, "helper"}, {inj, "opt-out"}, {inj, "opt-out-label"}, {off, "app"}, {disabled, "app"}} {
			assert.NotEqual(t, state, restartedFor(d[0], d[1]), "%s/%s is not injected: never restarted", d[0], d[1])
		}
	}

	// Without restart_pods nothing is restarted.
	apply(signer(t, root, root.pem), "applied")
	ann, _ := template(t, c, istio, "istiod")
	assert.Empty(t, ann)

	// Step 1: istiod, and nothing else yet.
	req.RestartPods = true
	next := apply(signer(t, root, root.pem), "unchanged")
	assert.Equal(t, now.Add(5*time.Second), next, "look again in 5s")
	s := cacerts(t, c, istio)
	state := s.Annotations[trust.RestartedIstiodAnnotation]
	require.NotEmpty(t, state)
	assert.Equal(t, now.UTC().Format(time.RFC3339), s.Annotations[trust.IstiodRestartedAtAnnotation])
	assert.Empty(t, s.Annotations[trust.RestartedWorkloadsAnnotation])
	ann, istiodVersion := template(t, c, istio, "istiod")
	assert.Equal(t, state, ann[trust.CAStateAnnotation])
	assert.Equal(t, now.UTC().Format(time.RFC3339), ann[trust.RestartedAtAnnotation])
	assert.Empty(t, restartedFor(inj, "app"), "workloads wait for istiod")
	assert.Empty(t, restartedFor(rev, "app"))

	// istio-ca-root-cert still carries the old root: workloads wait.
	now = now.Add(5 * time.Second)
	next = apply(signer(t, root, root.pem), "unchanged")
	assert.Equal(t, now.Add(5*time.Second), next)
	assert.Empty(t, restartedFor(inj, "app"), "not before istio-ca-root-cert carries the bundle")
	_, v := template(t, c, istio, "istiod")
	assert.Equal(t, istiodVersion, v, "istiod is restarted once")

	// istiod has written the bundle (order and extra roots do not matter).
	setRootCert(t, c, inj, string(root.pem))
	setRootCert(t, c, rev, string(old.pem)+string(root.pem))
	now = now.Add(5 * time.Second)
	next = apply(signer(t, root, root.pem), "unchanged")
	assert.True(t, next.After(now.Add(time.Hour)), "nothing pending: the next look is the renewal, got %v", next.Sub(now))
	assert.Equal(t, state, restartedFor(inj, "app"))
	assert.Equal(t, state, restartedFor(rev, "app"))
	untouched(state)
	s = cacerts(t, c, istio)
	assert.Equal(t, state, s.Annotations[trust.RestartedWorkloadsAnnotation])

	// The same CA state again: nothing is written.
	versions := map[string]string{}
	for _, d := range [][2]string{{istio, "istiod"}, {inj, "app"}, {rev, "app"}} {
		_, versions[d[0]+"/"+d[1]] = template(t, c, d[0], d[1])
	}
	now = now.Add(time.Minute)
	next = apply(signer(t, root, root.pem), "unchanged")
	assert.True(t, next.After(now.Add(time.Hour)))
	for _, d := range [][2]string{{istio, "istiod"}, {inj, "app"}, {rev, "app"}} {
		_, v := template(t, c, d[0], d[1])
		assert.Equal(t, versions[d[0]+"/"+d[1]], v, "%s/%s not restarted again", d[0], d[1])
	}
	again := cacerts(t, c, istio)
	assert.Equal(t, s.ResourceVersion, again.ResourceVersion)
	assert.Equal(t, s.Annotations, again.Annotations)

	// A new root is a new CA state: istiod first, then the workloads once
	// istio-ca-root-cert carries both roots.
	root2 := newRoot(t, "root-2")
	bundle := append(append([]byte(nil), root.pem...), root2.pem...)
	req.Issuer, req.RootBundle = trust.Fingerprint(root2.cert), bundle
	now = now.Add(time.Minute)
	next = apply(signer(t, root2, bundle), "applied")
	assert.Equal(t, now.Add(5*time.Second), next)
	state2 := cacerts(t, c, istio).Annotations[trust.RestartedIstiodAnnotation]
	assert.NotEqual(t, state, state2)
	assert.Equal(t, state2, restartedFor(istio, "istiod"))
	assert.Equal(t, state, restartedFor(inj, "app"))

	now = now.Add(5 * time.Second)
	apply(signer(t, root2, bundle), "unchanged")
	assert.Equal(t, state, restartedFor(inj, "app"), "istio-ca-root-cert has only the first root")
	setRootCert(t, c, inj, string(root2.pem)+string(root.pem))
	setRootCert(t, c, rev, string(bundle))
	now = now.Add(5 * time.Second)
	next = apply(signer(t, root2, bundle), "unchanged")
	assert.True(t, next.After(now.Add(time.Hour)))
	assert.Equal(t, state2, restartedFor(inj, "app"))
	assert.Equal(t, state2, restartedFor(rev, "app"))
	untouched(state2)
	assert.Equal(t, state2, cacerts(t, c, istio).Annotations[trust.RestartedWorkloadsAnnotation])
}

// A namespace whose istio-ca-root-cert never carries the bundle (stale, or
// not certificates at all) is waited for quietly, then given up 10 minutes
// after the istiod restart with a warning naming it; the others are
// restarted meanwhile.
func TestRestartPodsGivesUpOnStaleNamespaces(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	istio := namespace(t, c)
	deployment(t, c, istio, "istiod", nil)
	root, old := newRoot(t, "root"), newRoot(t, "old")
	ready := workloadNamespace(t, c, "stale-ready", map[string]string{"istio-injection": "enabled"})
	stale := workloadNamespace(t, c, "stale-old-root", map[string]string{"istio-injection": "enabled"})
	garbage := workloadNamespace(t, c, "stale-garbage", map[string]string{"istio.io/rev": "default"})
	badPEM := workloadNamespace(t, c, "stale-bad-pem", map[string]string{"istio-injection": "enabled"})
	missing := workloadNamespace(t, c, "stale-missing", map[string]string{"istio-injection": "enabled"})
	for _, ns := range []string{ready, stale, garbage, badPEM, missing} {
		deployment(t, c, ns, "app", nil)
	}
	setRootCert(t, c, ready, string(root.pem))
	setRootCert(t, c, stale, string(old.pem))
	setRootCert(t, c, garbage, "not a certificate")
	setRootCert(t, c, badPEM, "-----BEGIN CERTIFICATE-----\nbm9wZQ==\n-----END CERTIFICATE-----\n")

	var logs bytes.Buffer
	start := time.Now()
	now := start
	a := &trust.Agent{Client: c, Owner: "restart-stale", Clock: func() time.Time { return now },
		Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	req := request(istio, root)
	req.RestartPods = true
	set := &relaypb.OutputSet{Trust: []*relaypb.TrustRequest{req}}
	sign := signer(t, root, root.pem)
	restartedFor := func(ns string) string {
		t.Helper()
		ann, _ := template(t, c, ns, "app")
		return ann[trust.CAStateAnnotation]
	}

	results, next := a.Apply(ctx, set, sign)
	require.Equal(t, "applied", results[0].GetOutcome(), results[0].GetError())
	assert.Equal(t, now.Add(5*time.Second), next)
	state := cacerts(t, c, istio).Annotations[trust.RestartedIstiodAnnotation]
	require.NotEmpty(t, state)

	for _, after := range []time.Duration{5 * time.Second, time.Minute, 9 * time.Minute} {
		now = start.Add(after)
		results, next = a.Apply(ctx, set, sign)
		assert.Empty(t, results[0].GetError())
		assert.Equal(t, now.Add(5*time.Second), next, "still waiting %v after the istiod restart", after)
	}
	assert.Equal(t, state, restartedFor(ready), "a ready namespace does not wait for the others")
	for _, ns := range []string{stale, garbage, badPEM, missing} {
		assert.Empty(t, restartedFor(ns), ns)
	}
	for _, rec := range logLines(t, &logs) {
		assert.NotContains(t, []any{"WARN", "ERROR"}, rec["level"], "waiting is quiet: %v", rec)
	}
	assert.Empty(t, cacerts(t, c, istio).Annotations[trust.RestartedWorkloadsAnnotation])

	now = start.Add(10*time.Minute + time.Second)
	results, next = a.Apply(ctx, set, sign)
	assert.Empty(t, results[0].GetError())
	assert.True(t, next.After(now.Add(time.Hour)), "given up: nothing pending")
	assert.Equal(t, state, cacerts(t, c, istio).Annotations[trust.RestartedWorkloadsAnnotation])
	for _, ns := range []string{stale, garbage, badPEM, missing} {
		assert.Empty(t, restartedFor(ns), "%s is not restarted before its root cert is there", ns)
	}
	var warned []any
	for _, rec := range logLines(t, &logs) {
		if rec["level"] == "WARN" {
			warned = append(warned, rec["namespaces"])
		}
	}
	require.Len(t, warned, 1, "one warning")
	assert.ElementsMatch(t, []any{badPEM, garbage, missing, stale}, warned[0])
	assert.NotContains(t, logs.String(), "PRIVATE KEY")
}

// A cacerts the agent does not own restarts nothing and stays as it is.
func TestRestartPodsLeavesForeignCACerts(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	root := newRoot(t, "root")
	for _, tc := range []struct {
		name   string
		labels map[string]string
	}{
		{"unlabelled", nil},
		{"another owner", map[string]string{outputs.OwnerLabel: "someone-else"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			istio := namespace(t, c)
			deployment(t, c, istio, "istiod", nil)
			foreign := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: trust.SecretName, Namespace: istio, Labels: tc.labels},
				Data: map[string][]byte{trust.KeyCACert: []byte("theirs"), trust.KeyRootCert: root.pem}}
			created, err := c.CoreV1().Secrets(istio).Create(ctx, foreign, metav1.CreateOptions{})
			require.NoError(t, err)
			a := &trust.Agent{Client: c, Owner: "restart-foreign"}
			req := request(istio, root)
			req.RestartPods = true
			results, _ := a.Apply(ctx, &relaypb.OutputSet{Trust: []*relaypb.TrustRequest{req}}, signer(t, root, root.pem))
			require.Len(t, results, 1)
			assert.Equal(t, "conflict", results[0].GetOutcome())
			s := cacerts(t, c, istio)
			assert.Equal(t, created.ResourceVersion, s.ResourceVersion)
			assert.Empty(t, s.Annotations)
			ann, _ := template(t, c, istio, "istiod")
			assert.Empty(t, ann, "istiod is not restarted for a CA the agent does not own")
		})
	}
}
