package identity_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/identity/identitytest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// servedBy is a relay CA and the chain of a serving certificate it issued
// for "relay.test".
func servedBy(t *testing.T) (*ca.RelayCA, []*x509.Certificate) {
	t.Helper()
	r, err := ca.GenerateRelayCA(ca.GenerateConfig{})
	require.NoError(t, err)
	s, err := r.Signer(time.Now())
	require.NoError(t, err)
	a, err := ca.New(ca.Config{Signer: s})
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	iss, err := a.IssueServer(context.Background(), key.Public(), []string{"relay.test"}, nil)
	require.NoError(t, err)
	return r, append([]*x509.Certificate{iss.Certificate}, iss.Chain...)
}

func newBundleManager(t *testing.T, secrets identity.AgentSecrets) *identity.Manager {
	t.Helper()
	m, err := identity.NewManager(identity.ManagerConfig{Cluster: "c1", ServerAddress: "relay.test:9900", Secrets: secrets})
	require.NoError(t, err)
	return m
}

func TestATrustBundleWithTheNewRootBesideTheOldIsStoredAndPinned(t *testing.T) {
	old, chain := servedBy(t)
	next, _ := servedBy(t)
	secrets := identitytest.NewMemAgentSecrets(ca.CertsPEM(old.Root), "")
	m := newBundleManager(t, secrets)
	bundle := ca.CertsPEM(old.Root, next.Root)
	fp := ca.TrustBundleFingerprint([]*x509.Certificate{old.Root, next.Root})
	require.NoError(t, m.ApplyTrustBundle(context.Background(), bundle, fp, chain))
	require.NoError(t, m.ApplyTrustBundle(context.Background(), bundle, fp, chain))
	assert.Equal(t, 1, secrets.RootSaves(), "a bundle pinned already is not written again")
	stored, err := secrets.Roots(context.Background())
	require.NoError(t, err)
	got, err := ca.ParseTrustBundle(stored)
	require.NoError(t, err)
	assert.Equal(t, fp, ca.TrustBundleFingerprint(got), "both roots are pinned beside each other")
	tlsCfg, err := m.ClientTLS()
	require.NoError(t, err)
	_, err = chain[0].Verify(x509.VerifyOptions{Roots: tlsCfg.RootCAs, Intermediates: pool(chain[1:]...), DNSName: "relay.test"})
	assert.NoError(t, err, "the in-memory pool still verifies the server")
}

func TestATrustBundleThatWouldNotVerifyTheCurrentServerReplacesNothing(t *testing.T) {
	old, chain := servedBy(t)
	next, nextChain := servedBy(t)
	oldPEM := ca.CertsPEM(old.Root)
	onlyNext := ca.CertsPEM(next.Root)
	nextFP := ca.TrustBundleFingerprint([]*x509.Certificate{next.Root})
	for name, tc := range map[string]struct {
		bundle []byte
		fp     string
		chain  []*x509.Certificate
		want   string
	}{
		"a root that does not verify this server": {onlyNext, nextFP, chain, "does not verify the server"},
		"a fingerprint that does not match":       {onlyNext, ca.TrustBundleFingerprint([]*x509.Certificate{old.Root}), nextChain, "fingerprint"},
		"no server certificate known":             {onlyNext, nextFP, nil, "server certificate is unknown"},
		"malformed PEM":                           {[]byte("-----BEGIN CERTIFICATE-----\nnot base64\n"), nextFP, nextChain, "invalid relay trust bundle"},
		"oversized":                               {make([]byte, ca.MaxTrustBundleBytes+1), nextFP, nextChain, "more than"},
		"an issuing CA posing as a root":          {ca.CertsPEM(old.Issuer), ca.TrustBundleFingerprint([]*x509.Certificate{old.Issuer}), chain, "not self-signed"},
		"the server's own chain for another name": {oldPEM, ca.TrustBundleFingerprint([]*x509.Certificate{old.Root}), swapName(t, chain), "does not verify the server"},
	} {
		t.Run(name, func(t *testing.T) {
			secrets := identitytest.NewMemAgentSecrets(oldPEM, "")
			m := newBundleManager(t, secrets)
			err := m.ApplyTrustBundle(context.Background(), tc.bundle, tc.fp, tc.chain)
			require.Error(t, err)
			assert.True(t, errors.Is(err, identity.ErrBundleRefused), "%v", err)
			assert.Contains(t, err.Error(), tc.want)
			var stale interface{ NeedsNewSession() bool }
			assert.Equal(t, tc.want == "does not verify the server", errors.As(err, &stale) && stale.NeedsNewSession(),
				"only a bundle that does not verify this session's server may verify a new one")
			stored, err := secrets.Roots(context.Background())
			require.NoError(t, err)
			assert.Equal(t, oldPEM, stored, "the pinned roots are unchanged")
			_, err = m.ClientTLS()
			assert.Error(t, err, "no pool was installed")
		})
	}
}

// swapName is chain with a leaf for a name the agent does not dial.
func swapName(t *testing.T, chain []*x509.Certificate) []*x509.Certificate {
	t.Helper()
	c := *chain[0]
	c.DNSNames = []string{"elsewhere.test"}
	return append([]*x509.Certificate{&c}, chain[1:]...)
}

func pool(certs ...*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}
