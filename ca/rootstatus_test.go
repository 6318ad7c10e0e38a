package ca_test

import (
	"strings"
	"testing"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Only relay-mode clusters have an agent to acknowledge; each record
// carries the annotations as the server wrote them.
func TestRootAgentRecordsReadRelayModeClustersOnly(t *testing.T) {
	kc := func(name string, mode multiclusterv1alpha1.RegistrationMode, connected bool, ann map[string]string) multiclusterv1alpha1.KubernetesCluster {
		c := multiclusterv1alpha1.KubernetesCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann}}
		c.Spec.Mode, c.Status.Connected = mode, connected
		return c
	}
	got := ca.RootAgentRecords([]multiclusterv1alpha1.KubernetesCluster{
		kc("kubeconfig", multiclusterv1alpha1.ModeKubeconfig, true, map[string]string{ca.AnnotationRelayBundleAck: "x"}),
		kc("relay", multiclusterv1alpha1.ModeRelay, true, map[string]string{ca.AnnotationRelayBundleAck: "a", ca.AnnotationRelayBundleRefused: "b: no"}),
		kc("unset-mode", "", false, nil),
	})
	assert.Equal(t, []ca.RootAgentRecord{{Cluster: "relay", Connected: true, Acked: "a", Refused: "b: no"}, {Cluster: "unset-mode"}}, got)
	assert.Empty(t, ca.PendingRootAgents(got[:1], "a"), "an acknowledged agent is not pending, whatever it refused before")
	p := ca.PendingRootAgents(got, "c")
	require.Len(t, p, 2)
	assert.Equal(t, "relay", p[0].Cluster, "connected first")
	assert.Equal(t, "b: no", p[0].Refused)
	assert.Contains(t, p[1].Reason, "offline")
}

// The issuing CA's generation: absent is the first; anything but a
// number in [1, 2^20] is an error that does not echo the value.
func TestIssuerGenerationRefusesMalformedAnnotations(t *testing.T) {
	s := func(ann map[string]string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: ca.SigningSecretName, Annotations: ann}}
	}
	g, err := ca.IssuerGeneration(s(nil))
	require.NoError(t, err)
	assert.Equal(t, 1, g)
	g, err = ca.IssuerGeneration(s(map[string]string{"relaymesh.io/issuer-generation": "7"}))
	require.NoError(t, err)
	assert.Equal(t, 7, g)
	for _, v := range []string{"", "0", "-1", "1048577", "99999999999999999999", "7 ", "0x7", "<script>", strings.Repeat("9", 1<<16)} {
		_, err := ca.IssuerGeneration(s(map[string]string{"relaymesh.io/issuer-generation": v}))
		require.ErrorIs(t, err, ca.ErrInvalidSigner, "%.20q", v)
		assert.NotContains(t, err.Error(), "<script>")
	}
}

// IssuerGeneration never panics, accepts only [1, 2^20], and never echoes
// what it refused.
func FuzzIssuerGeneration(f *testing.F) {
	for _, v := range []string{"1", "7", "0", "-1", "1048576", "1048577", "", "x", "+3", "0x10"} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, v string) {
		g, err := ca.IssuerGeneration(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: ca.SigningSecretName,
			Annotations: map[string]string{"relaymesh.io/issuer-generation": v}}})
		if err != nil {
			require.ErrorIs(t, err, ca.ErrInvalidSigner)
			assert.True(t, strings.HasSuffix(err.Error(), "secret ns/relay-tls-signing-secret annotation relaymesh.io/issuer-generation is not a generation number"), "the value is not echoed: %s", err)
			return
		}
		assert.GreaterOrEqual(t, g, 1)
		assert.LessOrEqual(t, g, 1<<20)
	})
}

// The grace a transition records is read back; one that does not parse or
// is out of bounds is unknown (0), never an error that would stop replicas
// loading the rotation.
func TestDecodeRootRotationReadsTheRecordedGrace(t *testing.T) {
	rc := newRelayCA(t, ca.GenerateConfig{})
	old := ca.RootFingerprint(rc.Root)
	for value, want := range map[string]time.Duration{
		"24h2m0s":                       24*time.Hour + 2*time.Minute,
		"47s":                           47 * time.Second,
		"":                              0,
		"soon":                          0,
		"-1h":                           0,
		"0s":                            0,
		"87601h":                        0, // over ten years
		"1e400h":                        0,
		strings.Repeat("9", 4096) + "h": 0,
	} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "relay-root-tls-secret", Annotations: map[string]string{
			"relaymesh.io/root-rotation-phase": "Switching", "relaymesh.io/root-rotation-old": old, "relaymesh.io/root-rotation-new": strings.Repeat("ab", 32),
			"relaymesh.io/root-rotation-since": "2030-01-01T00:00:00Z", "relaymesh.io/root-rotation-revision": "5",
			"relaymesh.io/root-rotation-grace": value,
		}}, Data: map[string][]byte{"ca.crt": ca.CertsPEM(rc.Root)}}
		st, _, err := ca.DecodeRootRotation(s)
		require.NoError(t, err, "grace %.20q", value)
		assert.Equal(t, want, st.Grace, "grace %.20q", value)
		assert.Equal(t, ca.RootSwitching, st.Phase)
	}
}
