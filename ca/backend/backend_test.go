package backend_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/backend"
	"github.com/relaymesh/relaymesh/ca/catest"
	"github.com/relaymesh/relaymesh/ca/cfsslca"
	"github.com/relaymesh/relaymesh/ca/hsm"
	"github.com/relaymesh/relaymesh/ca/stepca"
	"github.com/relaymesh/relaymesh/test/localcluster"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  backend.Config
		want []string
	}{
		{"no type", backend.Config{}, []string{`type: "" is not one of generated, secret, pkcs11, cfssl, stepca`}},
		{"unknown type", backend.Config{Type: "vault"}, []string{`type: "vault" is not one of`}},
		{"generated without client", backend.Config{Type: backend.Generated}, []string{"generated.client: required", "generated.namespace: required"}},
		{"secret with nothing", backend.Config{Type: backend.Secret}, []string{"secret: certFile, keyFile and rootsFile, or name, namespace and client, are required"}},
		{"secret with both", backend.Config{Type: backend.Secret, Secret: backend.SecretConfig{CertFile: "c", Name: "n"}}, []string{"are alternatives"}},
		{"secret with some files", backend.Config{Type: backend.Secret, Secret: backend.SecretConfig{CertFile: "c"}}, []string{"secret.keyFile: required", "secret.rootsFile: required"}},
		{"pkcs11 fields are prefixed", backend.Config{Type: backend.PKCS11}, []string{"pkcs11.modulePath: required", "pkcs11.tokenLabel: required", "pkcs11.pinFile, pinEnv: one is required"}},
		{"cfssl fields are prefixed", backend.Config{Type: backend.CFSSL, CFSSL: cfsslca.Config{URL: "http://cfssl.example.test"}}, []string{"cfssl.url:", "plain http is only allowed to a loopback host", "cfssl.authKeyFile, authKeyEnv: one is required"}},
		{"stepca fields are prefixed", backend.Config{Type: backend.StepCA}, []string{"stepca.url: required", "stepca.provisioner: required"}},
		{"another type's section", backend.Config{Type: backend.CFSSL, PKCS11: hsm.Config{ModulePath: "/x.so"}, StepCA: stepca.Config{URL: "https://x"}}, []string{"pkcs11: set, but type is cfssl", "stepca: set, but type is cfssl"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Default().Validate()
			require.Error(t, err)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
			s, err := backend.New(context.Background(), tt.cfg)
			require.ErrorIs(t, err, ca.ErrInvalidSigner)
			assert.Nil(t, s)
		})
	}
}

// TestNew builds each back end through New. The remote and HSM back ends
// are exercised against their real counterparts in their own packages;
// here they only have to be reached (and fail on a missing server,
// module).
func TestNew(t *testing.T) {
	root := catest.NewRoot(t, catest.CAOptions{})
	issuing := root.NewIntermediate(t, catest.CAOptions{})
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, b, 0o600))
		return p
	}
	certFile, keyFile, rootsFile := write("tls.crt", issuing.ChainPEM()), write("tls.key", issuing.KeyPEM(t)), write("ca.crt", issuing.RootsPEM())
	pinFile, authKeyFile := write("pin", []byte("1234")), write("auth.key", []byte(strings.Repeat("ab", 32)))

	t.Run("secret from files", func(t *testing.T) {
		catest.RunSignerConformance(t, func(t *testing.T) ca.Signer {
			s, err := backend.New(context.Background(), backend.Config{Type: backend.Secret, Secret: backend.SecretConfig{CertFile: certFile, KeyFile: keyFile, RootsFile: rootsFile}})
			require.NoError(t, err)
			return s
		})
	})
	t.Run("pkcs11 reaches the module", func(t *testing.T) {
		_, err := backend.New(context.Background(), backend.Config{Type: backend.PKCS11, PKCS11: hsm.Config{
			ModulePath: filepath.Join(dir, "libnothing.so"), TokenLabel: "t", KeyLabel: "k", PINFile: pinFile, ChainFile: certFile, RootsFile: rootsFile,
		}})
		require.ErrorIs(t, err, ca.ErrInvalidSigner)
		assert.ErrorContains(t, err, "pkcs11: module")
	})
	t.Run("cfssl reaches the server", func(t *testing.T) {
		_, err := backend.New(context.Background(), backend.Config{Type: backend.CFSSL, CFSSL: cfsslca.Config{
			URL: "http://" + catest.FreeAddr(t), AuthKeyFile: authKeyFile, ChainFile: certFile, RootsFile: rootsFile,
		}})
		require.ErrorIs(t, err, ca.ErrInvalidSigner)
		assert.ErrorContains(t, err, "cfssl: no answer from the server")
	})
	t.Run("stepca reaches the server", func(t *testing.T) {
		jwk := write("provisioner.pem", catest.KeyPEM(t, catest.NewKey(t, catest.ECDSAP256)))
		_, err := backend.New(context.Background(), backend.Config{Type: backend.StepCA, StepCA: stepca.Config{
			URL: "https://" + catest.FreeAddr(t), Provisioner: "p", ProvisionerKeyFile: jwk, ChainFile: certFile, RootsFile: rootsFile,
		}})
		require.ErrorIs(t, err, ca.ErrInvalidSigner)
		assert.ErrorContains(t, err, "step-ca: no answer from the server")
	})
}

// TestNewInKubernetes: the generated CA and a provided CA in a Secret, on
// a real kube-apiserver.
func TestNewInKubernetes(t *testing.T) {
	ctx := context.Background()
	_, cs, _ := localcluster.Management(t, "relaymesh")

	generated, err := backend.New(ctx, backend.Config{Type: backend.Generated, Generated: backend.GeneratedConfig{Client: cs, Namespace: "relaymesh"}})
	require.NoError(t, err)
	_, err = cs.CoreV1().Secrets("relaymesh").Get(ctx, ca.SigningSecretName, metav1.GetOptions{})
	require.NoError(t, err, "the generated CA is kept in the management cluster")

	issuing := catest.NewRoot(t, catest.CAOptions{}).NewIntermediate(t, catest.CAOptions{})
	_, err = cs.CoreV1().Secrets("relaymesh").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "enterprise-ca"},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{"tls.crt": issuing.ChainPEM(), "tls.key": issuing.KeyPEM(t), "ca.crt": issuing.RootsPEM()},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	provided, err := backend.New(ctx, backend.Config{Type: backend.Secret, Secret: backend.SecretConfig{Client: cs, Namespace: "relaymesh", Name: "enterprise-ca"}})
	require.NoError(t, err)
	assert.True(t, provided.Chain()[0].Equal(issuing.Cert))

	_, err = backend.New(ctx, backend.Config{Type: backend.Secret, Secret: backend.SecretConfig{Client: cs, Namespace: "relaymesh", Name: "missing"}})
	require.ErrorIs(t, err, ca.ErrInvalidSigner)
	assert.ErrorContains(t, err, "secret relaymesh/missing")

	for _, s := range []ca.Signer{generated, provided} {
		a, err := ca.New(ca.Config{Signer: s, Clock: time.Now})
		require.NoError(t, err)
		key := catest.NewKey(t, catest.ECDSAP256)
		csr, err := ca.ParseCSR(catest.NewCSR(t, key, nil))
		require.NoError(t, err)
		iss, err := a.IssueAgent(ctx, csr, catest.AgentID)
		require.NoError(t, err)
		catest.CheckAgentCertificate(t, iss, key.Public(), catest.AgentID)
	}
}
