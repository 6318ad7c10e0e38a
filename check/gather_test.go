package check

import (
	"context"
	"strings"
	"testing"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// gatherFromManagement starts a management cluster with namespace ns
// (localcluster.Management) and returns a Config that gathers from it as
// its admin, the cluster, and its admin's typed and dynamic clients.
func gatherFromManagement(t *testing.T, ns string) (Config, *localcluster.Cluster, kubernetes.Interface, dynamic.Interface) {
	t.Helper()
	mgmt, kube, dyn := localcluster.Management(t, ns)
	clients, err := kubeclient.NewClients(mgmt.RESTConfig(), "mgmt")
	require.NoError(t, err)
	return Config{Mgmt: clients, Namespace: ns, Timeout: 5 * time.Second}, mgmt, kube, dyn
}

// Gather reads the relay root rotation the server wrote on a real
// apiserver — state, staged root, issuing CA generation and the agents'
// answers on their KubernetesClusters — and Evaluate names the phase and
// who has not acknowledged; state that does not decode is an error and
// nothing is written.
func TestGatherRelayRootRotationFromAPIServer(t *testing.T) {
	ctx := context.Background()
	const ns = "relaymesh"
	cfg, _, kube, dyn := gatherFromManagement(t, ns)
	rotation := func(o *Observations) Result {
		t.Helper()
		for _, r := range find(Evaluate(o, time.Now()), AreaRelayCA, ns+"/relay-root-tls-secret") {
			if strings.HasPrefix(r.Message, "relay CA:") || strings.Contains(r.Message, "relay root rotation") {
				return r
			}
		}
		t.Fatalf("no relay root rotation result")
		return Result{}
	}

	o := Gather(ctx, cfg)
	assert.Nil(t, o.RelayRotation, "no relay root Secret yet")
	assert.NoError(t, o.RelayRotationErr)

	rc, err := ca.LoadOrCreateRelayCA(ctx, kube, ns, ca.GenerateConfig{})
	require.NoError(t, err)
	o = Gather(ctx, cfg)
	require.NoError(t, o.RelayRotationErr)
	require.NotNil(t, o.RelayRotation)
	assert.Equal(t, ca.RootIdle, o.RelayRotation.State.Phase)
	assert.Equal(t, 1, o.IssuerGeneration)
	r := rotation(o)
	assert.Equal(t, OK, r.Severity, r.Message)
	assert.Contains(t, r.Message, "relay CA: root "+ca.RootFingerprint(rc.Roots()[0])[:16])
	assert.Contains(t, r.Message, "issuing CA generation 1")

	require.NoError(t, ca.RequestRootRotation(ctx, kube, ns, ca.RootRequestStart))
	// The server's steps: stage the new root, then enter AddingNewRoot.
	var d ca.RootDecision
	for range 2 {
		d, err = ca.StepRootRotation(ctx, kube, ns, ca.RootStepConfig{Rotation: ca.RootRotationConfig{Grace: time.Hour}}, nil)
		require.NoError(t, err)
	}
	require.Equal(t, ca.RootAddingNew, d.State.Phase)
	bundle := ca.BundleFingerprint(d.State.Effective().Bundle)
	for name, ann := range map[string]map[string]string{
		"acked":   {ca.AnnotationRelayBundleAck: bundle},
		"pending": nil,
		"refused": {ca.AnnotationRelayBundleRefused: bundle + ": the agent does not handle trust bundles (upgrade it)"},
	} {
		kc := &multiclusterv1alpha1.KubernetesCluster{TypeMeta: metav1.TypeMeta{APIVersion: multiclusterv1alpha1.GroupVersion.String(), Kind: "KubernetesCluster"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: ann}, Spec: multiclusterv1alpha1.KubernetesClusterSpec{Mode: multiclusterv1alpha1.ModeRelay}}
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(kc)
		require.NoError(t, err)
		created, err := dyn.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: u}, metav1.CreateOptions{})
		require.NoError(t, err)
		if name == "refused" {
			require.NoError(t, unstructured.SetNestedField(created.Object, true, "status", "connected"))
			_, err = dyn.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{})
			require.NoError(t, err)
		}
	}

	o = Gather(ctx, cfg)
	require.NoError(t, o.RelayRotationErr)
	require.NotNil(t, o.RelayRotation.Staged, "the staged root is read")
	assert.Equal(t, d.State.New, ca.RootFingerprint(o.RelayRotation.Staged))
	r = rotation(o)
	assert.Equal(t, Warning, r.Severity, r.Message)
	for _, want := range []string{"relay root rotation in phase AddingNewRoot", "2 agent(s) have not acknowledged the bundle of this phase, 1 of them connected: refused (refused), pending (offline)"} {
		assert.Contains(t, r.Message, want)
	}
	refused := find(Evaluate(o, time.Now()), AreaRelayCA, "refused")
	require.Len(t, refused, 1)
	assert.Equal(t, Error, refused[0].Severity)
	assert.Contains(t, refused[0].Message, "does not handle trust bundles")

	// Undecodable state: an error, and check writes nothing.
	s, err := kube.CoreV1().Secrets(ns).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
	require.NoError(t, err)
	s.Annotations["relaymesh.io/root-rotation-revision"] = "not a number"
	s, err = kube.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{})
	require.NoError(t, err)
	o = Gather(ctx, cfg)
	require.Error(t, o.RelayRotationErr)
	r = rotation(o)
	assert.Equal(t, Error, r.Severity, r.Message)
	assert.Contains(t, r.Message, "cannot read the relay root rotation")
	after, err := kube.CoreV1().Secrets(ns).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, s.ResourceVersion, after.ResourceVersion, "check only reads")
}
