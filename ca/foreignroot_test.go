package ca_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/ca"
)

// foreignCA is a SPIRE-like root: self-signed, a spiffe:// URI SAN naming
// its trust domain, signing SVIDs directly.
type foreignCA struct {
	cert *x509.Certificate
	key  crypto.Signer
}

func newForeignCA(t *testing.T, td string, notBefore, notAfter time.Time) foreignCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{Country: []string{"US"}, Organization: []string{"SPIFFE"}},
		NotBefore: notBefore, NotAfter: notAfter, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		URIs:     []*url.URL{{Scheme: "spiffe", Host: td}},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return foreignCA{cert: c, key: key}
}

// svid is a leaf the foreign key signs for id.
func (f foreignCA) svid(t *testing.T, id string, now time.Time) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(id)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(8), NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		URIs: []*url.URL{u}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, f.cert, key.Public(), f.key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func meshRootSigner(t *testing.T, now time.Time) (ca.Signer, *x509.Certificate) {
	t.Helper()
	r, err := ca.GenerateMeshRoot(ca.MeshRootConfig{VirtualMesh: "vm", Clock: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	s, err := r.Signer(now)
	if err != nil {
		t.Fatal(err)
	}
	return s, r.Cert
}

func TestCrossCertifyForeignRootConfinesTheForeignKeyToItsTrustDomain(t *testing.T) {
	now := time.Now()
	s, meshRoot := meshRootSigner(t, now)
	spire := newForeignCA(t, "spire.example", now.Add(-time.Hour), now.Add(48*time.Hour))
	cross, err := ca.CrossCertifyForeignRoot(context.Background(), s, spire.cert, "spire.example", now)
	if err != nil {
		t.Fatal(err)
	}
	if !cross.NotAfter.Equal(spire.cert.NotAfter) || cross.NotAfter.After(meshRoot.NotAfter) {
		t.Errorf("cross-certificate valid until %s, want the foreign root's %s", cross.NotAfter, spire.cert.NotAfter)
	}
	// Two ways a verifier uses a mesh's root-cert.pem (the VirtualMesh root
	// and the cross-certificate): every certificate in it an anchor (Go,
	// proxyless gRPC), or anchors only the self-signed and the
	// cross-certificate an intermediate on the way (OpenSSL-style).
	ways := map[string]x509.VerifyOptions{
		"all anchors":           {Roots: pool([]*x509.Certificate{meshRoot, cross})},
		"cross as intermediate": {Roots: pool([]*x509.Certificate{meshRoot}), Intermediates: pool([]*x509.Certificate{cross})},
	}
	for name, opts := range ways {
		opts.KeyUsages = []x509.ExtKeyUsage{x509.ExtKeyUsageAny}
		opts.CurrentTime = now
		if _, err := spire.svid(t, "spiffe://spire.example/client", now).Verify(opts); err != nil {
			t.Errorf("%s: an SVID of the foreign trust domain does not verify: %v", name, err)
		}
		for _, id := range []string{"spiffe://cluster-1.local/ns/prod/sa/payments", "spiffe://sub.spire.example/client", "spiffe://spire.example.evil/x"} {
			_, err := spire.svid(t, id, now).Verify(opts)
			if err == nil || !strings.Contains(err.Error(), "constraint") {
				t.Errorf("%s: an SVID the foreign key signed for %s: got %v, want a name-constraint refusal", name, id, err)
			}
		}
	}
	// Without it, nothing of the foreign trust domain verifies.
	if _, err := spire.svid(t, "spiffe://spire.example/client", now).Verify(x509.VerifyOptions{Roots: pool([]*x509.Certificate{meshRoot}), CurrentTime: now}); err == nil {
		t.Error("the foreign SVID verified against the VirtualMesh root alone")
	}
	if err := ca.CheckForeignCrossCertificate(cross, spire.cert, meshRoot, "spire.example", now); err != nil {
		t.Errorf("check of a good cross-certificate: %v", err)
	}
	if err := ca.CheckForeignCrossCertificate(cross, spire.cert, meshRoot, "other.example", now); err == nil {
		t.Error("a cross-certificate checked for another trust domain passed")
	}
	_, otherRoot := meshRootSigner(t, now)
	if err := ca.CheckForeignCrossCertificate(cross, spire.cert, otherRoot, "spire.example", now); err == nil {
		t.Error("a cross-certificate checked against another VirtualMesh root passed")
	}
	if err := ca.CheckForeignCrossCertificate(cross, spire.cert, meshRoot, "spire.example", cross.NotAfter); err == nil {
		t.Error("an expired cross-certificate passed")
	}
}

// requestOnly is a Signer whose CA wants certificate requests (as cfssl's
// and step-ca's do).
type requestOnly struct{ ca.Signer }

func (requestOnly) SignRequest(context.Context, *x509.Certificate, *x509.CertificateRequest) (*x509.Certificate, error) {
	return nil, errors.New("not used")
}

func TestCrossCertifyForeignRootRefuses(t *testing.T) {
	now := time.Now()
	s, _ := meshRootSigner(t, now)
	spire := newForeignCA(t, "spire.example", now.Add(-time.Hour), now.Add(48*time.Hour))
	expired := newForeignCA(t, "spire.example", now.Add(-48*time.Hour), now.Add(-time.Hour))
	future := newForeignCA(t, "spire.example", now.Add(time.Hour), now.Add(48*time.Hour))
	// An intermediate of the foreign root: a CA, not self-signed.
	sub := spire.svid(t, "spiffe://spire.example/x", now)
	rootKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	interTmpl := &x509.Certificate{SerialNumber: big.NewInt(9), Subject: pkix.Name{CommonName: "inter"}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, _ := x509.CreateCertificate(rand.Reader, interTmpl, spire.cert, rootKey.Public(), spire.key)
	inter, _ := x509.ParseCertificate(der)

	// A signer that issues through an intermediate (the relay CA's shape).
	viaIntermediate, err := newRelayCA(t, ca.GenerateConfig{}).Signer(now)
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		signer  ca.Signer
		foreign *x509.Certificate
		td      string
		want    string
	}{
		"a leaf":                  {s, sub, "spire.example", "not a CA"},
		"an intermediate":         {s, inter, "spire.example", "not a self-signed root"},
		"an expired root":         {s, expired.cert, "spire.example", "expired"},
		"a root not valid yet":    {s, future.cert, "spire.example", "not valid before"},
		"a bad trust domain":      {s, spire.cert, "Spire.Example/x", "trust domain"},
		"a CA that wants CSRs":    {requestOnly{s}, spire.cert, "spire.example", "certificate requests"},
		"no foreign certificate":  {s, nil, "spire.example", "not a CA"},
		"a root via intermediate": {viaIntermediate, spire.cert, "spire.example", "through an intermediate"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c, err := ca.CrossCertifyForeignRoot(context.Background(), tc.signer, tc.foreign, tc.td, now)
			if err == nil || !strings.Contains(err.Error(), tc.want) || c != nil {
				t.Fatalf("got %v, %v; want an error saying %q", c, err, tc.want)
			}
		})
	}
	if _, err := ca.CrossCertifyForeignRoot(context.Background(), requestOnly{s}, spire.cert, "spire.example", now); !errors.Is(err, ca.ErrNeedsRequest) {
		t.Errorf("a CA that wants CSRs: %v does not wrap ErrNeedsRequest", err)
	}
}
