package ca_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/catest"
	"github.com/relaymesh/relaymesh/test/localcluster"
)

// TestRelayCAInKubernetes stores the generated relay CA in a real
// kube-apiserver. Subtests share one environment, each in its own
// namespace.
func TestRelayCAInKubernetes(t *testing.T) {
	ctx := context.Background()
	_, cs, _ := localcluster.Management(t, "")
	var nsCount atomic.Int32
	newNamespace := func(t *testing.T) string {
		t.Helper()
		name := fmt.Sprintf("ca-test-%d", nsCount.Add(1))
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		require.NoError(t, err)
		return name
	}

	t.Run("first call creates both secrets, second loads the same CA", func(t *testing.T) {
		ns := newNamespace(t)
		s1, err := ca.LoadOrCreateRelayCA(ctx, cs, ns, ca.GenerateConfig{})
		require.NoError(t, err)

		root, err := cs.CoreV1().Secrets(ns).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, corev1.SecretTypeOpaque, root.Type)
		assert.Equal(t, "relaymesh", root.Labels["app.kubernetes.io/managed-by"])
		assert.ElementsMatch(t, []string{"ca.crt", "tls.key"}, keys(root.Data))
		assert.Equal(t, catest.CertsPEM(s1.Roots()...), root.Data["ca.crt"])

		signing, err := cs.CoreV1().Secrets(ns).Get(ctx, ca.SigningSecretName, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, corev1.SecretTypeTLS, signing.Type)
		assert.Equal(t, "relaymesh", signing.Labels["app.kubernetes.io/managed-by"])
		assert.ElementsMatch(t, []string{"ca.crt", "tls.crt", "tls.key"}, keys(signing.Data))
		assert.Equal(t, catest.CertsPEM(s1.Chain()...), signing.Data["tls.crt"])
		assert.Equal(t, root.Data["ca.crt"], signing.Data["ca.crt"])

		s2, err := ca.LoadOrCreateRelayCA(ctx, cs, ns, ca.GenerateConfig{})
		require.NoError(t, err)
		assert.Equal(t, s1.Roots(), s2.Roots(), "same root")
		assert.Equal(t, s1.Chain(), s2.Chain(), "same issuing CA")
		assertUnchanged(t, cs, ns, map[string]string{ca.RootSecretName: root.ResourceVersion, ca.SigningSecretName: signing.ResourceVersion})

		// A certificate issued from the reloaded CA verifies with the first.
		a, err := ca.New(ca.Config{Signer: s2})
		require.NoError(t, err)
		key := catest.NewKey(t, catest.ECDSAP256)
		csr, err := ca.ParseCSR(catest.NewCSR(t, key, nil))
		require.NoError(t, err)
		iss, err := a.IssueAgent(ctx, csr, catest.AgentID)
		require.NoError(t, err)
		iss.Roots = s1.Roots()
		catest.CheckAgentCertificate(t, iss, key.Public(), catest.AgentID)

		rootsPEM, err := ca.RelayRootsPEM(ctx, cs, ns)
		require.NoError(t, err)
		assert.Equal(t, root.Data["ca.crt"], rootsPEM)
		assert.NotContains(t, string(rootsPEM), "PRIVATE KEY")
	})

	t.Run("concurrent callers end with one CA", func(t *testing.T) {
		ns := newNamespace(t)
		const callers = 4
		signers := make([]ca.Signer, callers)
		errs := make([]error, callers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				<-start
				signers[i], errs[i] = ca.LoadOrCreateRelayCA(ctx, cs, ns, ca.GenerateConfig{})
			})
		}
		close(start)
		wg.Wait()
		stored, err := ca.RelayRootsPEM(ctx, cs, ns)
		require.NoError(t, err)
		for i := range callers {
			require.NoError(t, errs[i], "caller %d", i)
			assert.Equal(t, stored, catest.CertsPEM(signers[i].Roots()...), "caller %d uses the stored root", i)
			assert.Equal(t, signers[0].Chain(), signers[i].Chain(), "caller %d uses the stored issuing CA", i)
		}
	})

	// secretsOf returns the secrets a generated CA would be stored in.
	secretsOf := func(t *testing.T) (root, signing *corev1.Secret) {
		r := newRelayCA(t, ca.GenerateConfig{})
		root = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: ca.RootSecretName},
			Data:       map[string][]byte{"ca.crt": catest.CertsPEM(r.Root), "tls.key": catest.KeyPEM(t, r.RootKey)},
		}
		signing = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: ca.SigningSecretName},
			Type:       corev1.SecretTypeTLS,
			Data: map[string][]byte{
				"tls.crt": catest.CertsPEM(r.Issuer),
				"tls.key": catest.KeyPEM(t, r.IssuerKey),
				"ca.crt":  catest.CertsPEM(r.Root),
			},
		}
		return root, signing
	}
	create := func(t *testing.T, ns string, secrets ...*corev1.Secret) map[string]string {
		t.Helper()
		versions := map[string]string{}
		for _, s := range secrets {
			created, err := cs.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{})
			require.NoError(t, err)
			versions[created.Name] = created.ResourceVersion
		}
		return versions
	}

	t.Run("a signing secret without its root is an error and changes nothing", func(t *testing.T) {
		_, signing := secretsOf(t)
		ns := newNamespace(t)
		versions := create(t, ns, signing)
		got, err := ca.LoadOrCreateRelayCA(ctx, cs, ns, ca.GenerateConfig{})
		require.ErrorIs(t, err, ca.ErrInvalidSigner)
		assert.Contains(t, err.Error(), "half present")
		assert.Contains(t, err.Error(), ca.SigningSecretName+" exists")
		assert.Nil(t, got)
		assertUnchanged(t, cs, ns, versions)
	})

	t.Run("a root without its signing secret is completed once, from that root", func(t *testing.T) {
		// A replica that stopped between its two writes leaves the root
		// secret alone. Callers that start together wait for the signing
		// secret, then one makes it from the stored root; all use it.
		root, _ := secretsOf(t)
		ns := newNamespace(t)
		versions := create(t, ns, root)
		const callers = 3
		signers := make([]ca.Signer, callers)
		errs := make([]error, callers)
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() { signers[i], errs[i] = ca.LoadOrCreateRelayCA(ctx, cs, ns, ca.GenerateConfig{}) })
		}
		wg.Wait()
		stored, err := cs.CoreV1().Secrets(ns).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, versions[ca.RootSecretName], stored.ResourceVersion, "the root secret is never changed")
		signing, err := cs.CoreV1().Secrets(ns).Get(ctx, ca.SigningSecretName, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, root.Data["ca.crt"], signing.Data["ca.crt"], "the signing secret names the stored root")
		for i := range callers {
			require.NoError(t, errs[i], "caller %d", i)
			assert.Equal(t, root.Data["ca.crt"], catest.CertsPEM(signers[i].Roots()...), "caller %d uses the stored root", i)
			assert.Equal(t, signing.Data["tls.crt"], catest.CertsPEM(signers[i].Chain()...), "caller %d uses the one issuing CA", i)
		}
		// Its certificates verify against the stored root.
		a, err := ca.New(ca.Config{Signer: signers[0]})
		require.NoError(t, err)
		key := catest.NewKey(t, catest.ECDSAP256)
		csr, err := ca.ParseCSR(catest.NewCSR(t, key, nil))
		require.NoError(t, err)
		iss, err := a.IssueAgent(ctx, csr, catest.AgentID)
		require.NoError(t, err)
		catest.CheckAgentCertificate(t, iss, key.Public(), catest.AgentID)
	})

	t.Run("a root whose key does not match is an error and changes nothing", func(t *testing.T) {
		root, signing := secretsOf(t)
		root.Data["tls.key"] = signing.Data["tls.key"]
		ns := newNamespace(t)
		versions := create(t, ns, root)
		got, err := ca.LoadOrCreateRelayCA(ctx, cs, ns, ca.GenerateConfig{})
		require.ErrorIs(t, err, ca.ErrInvalidSigner)
		assert.Contains(t, err.Error(), "root key does not belong")
		assert.NotContains(t, err.Error(), "PRIVATE KEY-----", "no key material in errors")
		assert.Nil(t, got)
		assertUnchanged(t, cs, ns, versions)
	})

	t.Run("malformed or mismatched secrets are errors and change nothing", func(t *testing.T) {
		tests := []struct {
			name   string
			mutate func(root, signing *corev1.Secret)
			want   string
		}{
			{"garbage issuer key", func(_, s *corev1.Secret) { s.Data["tls.key"] = []byte("garbage") }, "tls.key"},
			{"missing root certificate", func(r, _ *corev1.Secret) { delete(r.Data, "ca.crt") }, "ca.crt: empty"},
			{"garbage root certificate", func(r, _ *corev1.Secret) {
				r.Data["ca.crt"] = []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
			}, "ca.crt"},
			{"issuer key does not match", func(r, s *corev1.Secret) { s.Data["tls.key"] = r.Data["tls.key"] }, "does not belong"},
			{"root key does not match", func(r, s *corev1.Secret) { r.Data["tls.key"] = s.Data["tls.key"] }, "root key does not belong"},
			{"roots differ", func(_, s *corev1.Secret) {
				_, other := secretsOf(t)
				s.Data["ca.crt"] = other.Data["ca.crt"]
			}, "differs from"},
			{"issuer from another CA", func(_, s *corev1.Secret) {
				_, other := secretsOf(t)
				s.Data["tls.crt"], s.Data["tls.key"] = other.Data["tls.crt"], other.Data["tls.key"]
			}, "does not chain to the roots"},
			{"two issuing certificates", func(_, s *corev1.Secret) {
				s.Data["tls.crt"] = append(append([]byte{}, s.Data["tls.crt"]...), s.Data["tls.crt"]...)
			}, "2 certificates, want 1"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				ns := newNamespace(t)
				root, signing := secretsOf(t)
				tt.mutate(root, signing)
				versions := create(t, ns, root, signing)
				got, err := ca.LoadOrCreateRelayCA(ctx, cs, ns, ca.GenerateConfig{})
				require.ErrorIs(t, err, ca.ErrInvalidSigner)
				assert.Contains(t, err.Error(), tt.want)
				assert.NotContains(t, err.Error(), "PRIVATE KEY-----", "no key material in errors")
				assert.Nil(t, got)
				assertUnchanged(t, cs, ns, versions)
			})
		}
	})

	t.Run("a failed second create rolls back the first", func(t *testing.T) {
		// A quota of one secret lets the root secret in and refuses the
		// signing secret. There is no quota controller, so the test sets
		// the quota's status itself; admission keeps it up to date.
		ns := newNamespace(t)
		quotas := cs.CoreV1().ResourceQuotas(ns)
		hard := corev1.ResourceList{"count/secrets": resource.MustParse("1")}
		q, err := quotas.Create(ctx, &corev1.ResourceQuota{
			ObjectMeta: metav1.ObjectMeta{Name: "one-secret"},
			Spec:       corev1.ResourceQuotaSpec{Hard: hard},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		q.Status = corev1.ResourceQuotaStatus{Hard: hard, Used: corev1.ResourceList{"count/secrets": resource.MustParse("0")}}
		_, err = quotas.UpdateStatus(ctx, q, metav1.UpdateOptions{})
		require.NoError(t, err)

		got, err := ca.LoadOrCreateRelayCA(ctx, cs, ns, ca.GenerateConfig{})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "create secret "+ns+"/"+ca.SigningSecretName)
		assert.Contains(t, err.Error(), "exceeded quota")
		assert.Nil(t, got)
		assertUnchanged(t, cs, ns, map[string]string{})
	})

	t.Run("RelayRootsPEM", func(t *testing.T) {
		ns := newNamespace(t)
		_, err := ca.RelayRootsPEM(ctx, cs, ns)
		assert.True(t, apierrors.IsNotFound(err), "no secret: NotFound, got %v", err)

		root, _ := secretsOf(t)
		root.Data["ca.crt"] = append(append([]byte{}, root.Data["ca.crt"]...), root.Data["tls.key"]...)
		create(t, ns, root)
		pem, err := ca.RelayRootsPEM(ctx, cs, ns)
		require.NoError(t, err)
		assert.NotContains(t, string(pem), "PRIVATE KEY", "only certificates leave, even if ca.crt holds more")
	})
}

// assertUnchanged checks that namespace ns holds exactly the named secrets
// at the given resource versions.
func assertUnchanged(t *testing.T, cs kubernetes.Interface, ns string, versions map[string]string) {
	t.Helper()
	list, err := cs.CoreV1().Secrets(ns).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	got := map[string]string{}
	for _, s := range list.Items {
		got[s.Name] = s.ResourceVersion
	}
	assert.Equal(t, versions, got, "secrets in %s changed", ns)
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
