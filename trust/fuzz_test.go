package trust

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"go.step.sm/crypto/keyutil"
)

// FuzzCheckResponse feeds the agent hostile answers to a trust request: it
// must never panic, and whatever it accepts is an intermediate CA for the
// agent's own key that verifies to the requested root.
func FuzzCheckResponse(f *testing.F) {
	now := time.Now()
	rootKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	rootTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "root"}, NotBefore: now.Add(-time.Hour),
		NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true, MaxPathLen: 1, KeyUsage: x509.KeyUsageCertSign}
	rootDER, _ := x509.CreateCertificate(rand.Reader, rootTmpl, rootTmpl, rootKey.Public(), rootKey)
	root, _ := x509.ParseCertificate(rootDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	interTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "mesh"}, NotBefore: now.Add(-time.Hour),
		NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true, MaxPathLen: 0, MaxPathLenZero: true, KeyUsage: x509.KeyUsageCertSign}
	interDER, _ := x509.CreateCertificate(rand.Reader, interTmpl, root, key.Public(), rootKey)
	inter, _ := x509.ParseCertificate(interDER)
	bundle := ca.CertsPEM(root)
	issuer := Fingerprint(root)
	f.Add(ca.CertsPEM(inter), bundle, issuer)
	f.Add(ca.CertsPEM(inter, root), bundle, issuer)
	f.Add(ca.CertsPEM(root), bundle, issuer)
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), bundle, issuer)
	f.Add([]byte{}, []byte{}, "")
	req := &relaypb.TrustRequest{Mesh: "m", Namespace: "istio-system", RootBundle: bundle, Issuer: issuer}
	f.Fuzz(func(t *testing.T, chainPEM, bundlePEM []byte, iss string) {
		resp := &relaypb.IntermediateResponse{CertificateChain: chainPEM, RootBundle: bundlePEM, Issuer: iss}
		chain, err := checkResponse(resp, req, key.Public(), now)
		if err != nil {
			return
		}
		if !keyutil.Equal(key.Public(), chain[0].PublicKey) || !chain[0].IsCA || chain[0].MaxPathLen != 0 {
			t.Fatal("accepted an intermediate that is not a path-length-0 CA for our key")
		}
		if err := verifies(chain[0], chain[1:], []*x509.Certificate{root}, now); err != nil {
			t.Fatalf("accepted a chain that does not verify to the requested root: %v", err)
		}
	})
}

// FuzzCheckCross feeds the agent hostile second signatures of a
// CrossSigned step: never a panic, and whatever it accepts is the
// intermediate's subject and key, a path-length-0 CA, verifying to the
// cross root the request names.
func FuzzCheckCross(f *testing.F) {
	now := time.Now()
	newRoot := func(name string) (*x509.Certificate, *ecdsa.PrivateKey) {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: now.Add(-time.Hour),
			NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true, MaxPathLen: 1, KeyUsage: x509.KeyUsageCertSign}
		der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, k.Public(), k)
		c, _ := x509.ParseCertificate(der)
		return c, k
	}
	root, rootKey := newRoot("root")
	second, secondKey := newRoot("second")
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	sign := func(parent *x509.Certificate, parentKey *ecdsa.PrivateKey) *x509.Certificate {
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "mesh"}, NotBefore: now.Add(-time.Hour),
			NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true, MaxPathLen: 0, MaxPathLenZero: true, KeyUsage: x509.KeyUsageCertSign}
		der, _ := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
		c, _ := x509.ParseCertificate(der)
		return c
	}
	primary, cross := sign(root, rootKey), sign(second, secondKey)
	f.Add(ca.CertsPEM(cross), ca.CertsPEM(second), Fingerprint(second))
	f.Add(ca.CertsPEM(cross, second), ca.CertsPEM(second), Fingerprint(second))
	f.Add(ca.CertsPEM(primary), ca.CertsPEM(root), Fingerprint(root))
	f.Add(ca.CertsPEM(second), ca.CertsPEM(second, root), Fingerprint(second))
	f.Add([]byte{}, []byte{}, "")
	f.Fuzz(func(t *testing.T, crossPEM, crossRootPEM []byte, crossIssuer string) {
		req := &relaypb.TrustRequest{Mesh: "m", Namespace: "istio-system", RootBundle: ca.CertsPEM(root), Issuer: Fingerprint(root),
			CrossIssuer: crossIssuer, CrossRoot: crossRootPEM}
		got, err := checkCross(&relaypb.IntermediateResponse{CrossCertificateChain: crossPEM}, req, primary, now)
		if err != nil || got == nil {
			return
		}
		r, err := crossRoot(req)
		if err != nil {
			t.Fatalf("accepted a second signature under a cross root that is refused: %v", err)
		}
		c := got[0]
		if !keyutil.Equal(key.Public(), c.PublicKey) || c.Subject.String() != primary.Subject.String() || !c.IsCA || c.MaxPathLen != 0 {
			t.Fatal("accepted a second signature that is not the intermediate's subject and key as a path-length-0 CA")
		}
		if err := verifies(c, got[1:], []*x509.Certificate{r}, now); err != nil {
			t.Fatalf("accepted a second signature that does not verify to the cross root: %v", err)
		}
	})
}

// FuzzRecordedRoots parses the root bundles a status.rotation carries:
// never a panic, and an accepted bundle carries the named root.
func FuzzRecordedRoots(f *testing.F) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "root"}, NotBefore: time.Now(),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	cert, _ := x509.ParseCertificate(der)
	f.Add(string(ca.CertsPEM(cert)), Fingerprint(cert))
	f.Add("not pem", "")
	f.Add("", Fingerprint(cert))
	f.Fuzz(func(t *testing.T, bundle, fp string) {
		roots, err := recordedRoots(bundle, fp)
		if err != nil {
			return
		}
		found := false
		for _, r := range roots {
			found = found || Fingerprint(r) == fp
		}
		if !found {
			t.Fatal("accepted a bundle without the named root")
		}
	})
}
