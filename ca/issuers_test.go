package ca_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/catest"
	"github.com/relaymesh/relaymesh/test/localcluster"
)

// TestRelayIssuerRenewsTwiceAndDropsEachPreviousOnlyAfterItsCertificatesExpire
// runs two renewals of the generated issuing CA on a real apiserver with
// an injected clock: a replica that reloads issues from the new issuing CA,
// still accepts an agent certificate of the previous one until Keep after
// the switch, and then no longer lists it.
func TestRelayIssuerRenewsTwiceAndDropsEachPreviousOnlyAfterItsCertificatesExpire(t *testing.T) {
	ctx := context.Background()
	_, cs, _ := localcluster.Management(t, "")
	ns := newIssuerNamespace(t, cs, "issuer-renew")
	clk := newClock(time.Now())
	gen := ca.GenerateConfig{IssuerTTL: time.Hour, Clock: clk.Now}
	renew := ca.RenewConfig{CA: gen, Keep: 12 * time.Minute}

	s, err := ca.LoadOrCreateRelayCA(ctx, cs, ns, gen)
	require.NoError(t, err)
	replica, ok := s.(*ca.RelayIssuers)
	require.True(t, ok, "the generated relay CA is a RelayIssuers")
	auth, err := ca.New(ca.Config{Signer: replica, AgentTTL: 10 * time.Minute, Clock: clk.Now})
	require.NoError(t, err)
	first := replica.Chain()[0]
	root := replica.Roots()[0]
	assert.Equal(t, 1, replica.Generation())

	// Before 2/3 of its life: nothing is written.
	clk.Set(ca.IssuerRenewalTime(first, ca.DefaultIssuerRenewAt).Add(-time.Second))
	before := signingVersion(t, cs, ns)
	res, err := ca.RenewRelayIssuer(ctx, cs, ns, renew)
	require.NoError(t, err)
	assert.False(t, res.Renewed)
	assert.Equal(t, before, signingVersion(t, cs, ns), "no renewal due: the secret is unchanged")

	// An agent certificate of the first issuing CA, issued just before the switch.
	clk.Set(ca.IssuerRenewalTime(first, ca.DefaultIssuerRenewAt))
	oldAgent := issueAgent(t, auth)
	require.Equal(t, first.Raw, oldAgent.Chain[0].Raw)

	res, err = ca.RenewRelayIssuer(ctx, cs, ns, renew)
	require.NoError(t, err)
	require.True(t, res.Renewed)
	assert.Equal(t, 2, res.Generation)
	second := res.Current
	assert.False(t, second.Equal(first))
	require.NoError(t, second.CheckSignatureFrom(root), "the next issuing CA is under the same root")

	changed, err := replica.Reload(ctx)
	require.NoError(t, err)
	assert.True(t, changed)
	assert.Equal(t, 2, replica.Generation())
	assert.Equal(t, []*x509.Certificate{second, first}, replica.AcceptedIssuers(), "current first, then the previous")
	newAgent := issueAgent(t, auth)
	assert.Equal(t, second.Raw, newAgent.Chain[0].Raw, "issues from the new issuing CA")
	assert.Equal(t, root.Raw, newAgent.Roots[0].Raw, "agents pin the same root")

	// A loader starting now (a new replica) accepts both as well.
	fresh, err := ca.LoadOrCreateRelayCA(ctx, cs, ns, gen)
	require.NoError(t, err)
	assert.Len(t, fresh.(*ca.RelayIssuers).AcceptedIssuers(), 2)

	// Before Keep has passed and while the old agent certificate is valid:
	// still kept.
	clk.Set(oldAgent.Certificate.NotAfter.Add(-time.Second))
	res, err = ca.RenewRelayIssuer(ctx, cs, ns, renew)
	require.NoError(t, err)
	assert.False(t, res.Renewed)
	assert.Empty(t, res.Dropped)
	assert.Len(t, replica.AcceptedIssuers(), 2)

	// Keep after the switch every certificate of the first has expired: dropped.
	clk.Set(clk.Now().Add(renew.Keep))
	require.True(t, oldAgent.Certificate.NotAfter.Before(clk.Now()))
	res, err = ca.RenewRelayIssuer(ctx, cs, ns, renew)
	require.NoError(t, err)
	require.Len(t, res.Dropped, 1)
	assert.True(t, res.Dropped[0].Equal(first))
	_, err = replica.Reload(ctx)
	require.NoError(t, err)
	assert.Equal(t, []*x509.Certificate{second}, replica.AcceptedIssuers())

	// The second renewal.
	clk.Set(ca.IssuerRenewalTime(second, ca.DefaultIssuerRenewAt))
	res, err = ca.RenewRelayIssuer(ctx, cs, ns, renew)
	require.NoError(t, err)
	require.True(t, res.Renewed)
	assert.Equal(t, 3, res.Generation)
	_, err = replica.Reload(ctx)
	require.NoError(t, err)
	assert.Equal(t, []*x509.Certificate{res.Current, second}, replica.AcceptedIssuers())
	require.NoError(t, res.Current.CheckSignatureFrom(root))
}

// TestHostileSigningSecretChangesNothing writes hostile previous issuers
// and annotations into a real signing secret: Reload and RenewRelayIssuer
// refuse them with ErrInvalidSigner, and the replica keeps what it had.
func TestHostileSigningSecretChangesNothing(t *testing.T) {
	ctx := context.Background()
	_, cs, _ := localcluster.Management(t, "")
	foreign := newRelayCA(t, ca.GenerateConfig{})
	cases := []struct {
		name   string
		mutate func(s *corev1.Secret, cur *x509.Certificate)
		want   string
	}{
		{"an issuing CA under another root", func(s *corev1.Secret, _ *x509.Certificate) {
			s.Data["previous.crt"] = catest.CertsPEM(foreign.Issuer)
		}, "not signed by the relay root"},
		{"a root as a previous issuer", func(s *corev1.Secret, _ *x509.Certificate) {
			s.Data["previous.crt"] = catest.CertsPEM(foreign.Root)
		}, "not an issuing CA"},
		{"the current issuer as previous", func(s *corev1.Secret, cur *x509.Certificate) {
			s.Data["previous.crt"] = catest.CertsPEM(cur)
		}, "is the current issuing CA"},
		{"not PEM", func(s *corev1.Secret, _ *x509.Certificate) {
			s.Data["previous.crt"] = []byte("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
		}, "previous.crt"},
		{"oversized", func(s *corev1.Secret, _ *x509.Certificate) {
			s.Data["previous.crt"] = []byte(strings.Repeat("A", 20<<10))
		}, "more than"},
		{"a generation that is no number", func(s *corev1.Secret, _ *x509.Certificate) {
			s.Annotations = map[string]string{"relaymesh.io/issuer-generation": "-3"}
		}, "issuer-generation"},
		{"a switch time that is no time", func(s *corev1.Secret, _ *x509.Certificate) {
			s.Annotations = map[string]string{"relaymesh.io/issuer-switched-at": "yesterday"}
		}, "issuer-switched-at"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := newIssuerNamespace(t, cs, fmt.Sprintf("issuer-hostile-%d", i))
			s, err := ca.LoadOrCreateRelayCA(ctx, cs, ns, ca.GenerateConfig{})
			require.NoError(t, err)
			replica := s.(*ca.RelayIssuers)
			cur := replica.Chain()[0]
			sec, err := cs.CoreV1().Secrets(ns).Get(ctx, ca.SigningSecretName, metav1.GetOptions{})
			require.NoError(t, err)
			tc.mutate(sec, cur)
			sec, err = cs.CoreV1().Secrets(ns).Update(ctx, sec, metav1.UpdateOptions{})
			require.NoError(t, err)

			changed, err := replica.Reload(ctx)
			require.ErrorIs(t, err, ca.ErrInvalidSigner)
			assert.ErrorContains(t, err, tc.want)
			assert.NotContains(t, err.Error(), "PRIVATE KEY")
			assert.False(t, changed)
			assert.Equal(t, []*x509.Certificate{cur}, replica.AcceptedIssuers(), "the replica keeps what it had")

			_, err = ca.RenewRelayIssuer(ctx, cs, ns, ca.RenewConfig{Keep: time.Hour})
			require.ErrorIs(t, err, ca.ErrInvalidSigner)
			assert.Equal(t, sec.ResourceVersion, signingVersion(t, cs, ns), "nothing written")

			_, err = ca.LoadOrCreateRelayCA(ctx, cs, ns, ca.GenerateConfig{})
			require.ErrorIs(t, err, ca.ErrInvalidSigner, "a starting replica refuses it too")
		})
	}
}

func TestParsePreviousIssuers(t *testing.T) {
	clk := newClock(time.Now())
	r := newRelayCA(t, ca.GenerateConfig{Clock: clk.Now})
	other := newRelayCA(t, ca.GenerateConfig{Clock: clk.Now})
	sibling := renewedIssuer(t, r)
	cases := []struct {
		name string
		in   []byte
		want int
		err  string
	}{
		{"empty is none", nil, 0, ""},
		{"one sibling", catest.CertsPEM(sibling), 1, ""},
		{"twice", catest.CertsPEM(sibling, sibling), 0, "listed twice"},
		{"another root's issuer", catest.CertsPEM(other.Issuer), 0, "not signed by the relay root"},
		{"the root itself", catest.CertsPEM(r.Root), 0, "not an issuing CA"},
		{"current", catest.CertsPEM(r.Issuer), 0, "current"},
		{"too many", catest.CertsPEM(sibling, renewedIssuer(t, r), renewedIssuer(t, r), renewedIssuer(t, r), renewedIssuer(t, r)), 0, "more than 4"},
		{"a key", catest.KeyPEM(t, r.IssuerKey), 0, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ca.ParsePreviousIssuers(tc.in, r.Root, r.Issuer)
			if tc.name == "a key" {
				require.Error(t, err, "a private key is no certificate")
				assert.NotContains(t, err.Error(), "PRIVATE")
				return
			}
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				assert.Nil(t, got)
				return
			}
			require.NoError(t, err)
			assert.Len(t, got, tc.want)
		})
	}
}

func FuzzParsePreviousIssuers(f *testing.F) {
	r, err := ca.GenerateRelayCA(ca.GenerateConfig{})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(ca.CertsPEM(r.Issuer))
	f.Add(ca.CertsPEM(r.Root, r.Issuer))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n\n-----END CERTIFICATE-----\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		certs, err := ca.ParsePreviousIssuers(b, r.Root, nil)
		if err != nil {
			return
		}
		for _, c := range certs {
			if err := c.CheckSignatureFrom(r.Root); err != nil || !c.IsCA {
				t.Fatalf("accepted %v not a CA signed by the root", c.Subject)
			}
		}
	})
}

// renewedIssuer is a next issuing CA of r (same root), as a renewal makes.
func renewedIssuer(t *testing.T, r *ca.RelayCA) *x509.Certificate {
	t.Helper()
	next, err := ca.NextRelayIssuer(ca.GenerateConfig{}, r)
	require.NoError(t, err)
	return next.Issuer
}

func issueAgent(t *testing.T, auth *ca.Authority) *ca.Issued {
	t.Helper()
	key := catest.NewKey(t, catest.ECDSAP256)
	csr, err := x509.ParseCertificateRequest(catest.NewCSR(t, key, &x509.CertificateRequest{}))
	require.NoError(t, err)
	iss, err := auth.IssueAgent(context.Background(), csr, spiffeid.RequireFromString("spiffe://relaymesh.local/cluster/c1"))
	require.NoError(t, err)
	return iss
}

func signingVersion(t *testing.T, cs kubernetes.Interface, ns string) string {
	t.Helper()
	s, err := cs.CoreV1().Secrets(ns).Get(context.Background(), ca.SigningSecretName, metav1.GetOptions{})
	require.NoError(t, err)
	return s.ResourceVersion
}

func newIssuerNamespace(t *testing.T, cs kubernetes.Interface, name string) string {
	t.Helper()
	_, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return name
}
