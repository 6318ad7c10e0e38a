package trust_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/ca/catest"
	"github.com/relaymesh/relaymesh/ca/stepca"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.step.sm/crypto/jose"
	"go.step.sm/crypto/kms/apiv1"
	kmspkcs11 "go.step.sm/crypto/kms/pkcs11"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The SoftHSM2 token of this test binary. The PIN is long and distinctive
// so that a search for it in errors and logs cannot miss a leak.
const (
	hsmToken = "relaymesh-trust"
	hsmPIN   = "pin-7e2c90d4a1b3-trust"
	hsmSOPIN = "so-pin-5a8c61"
)

// hsmModule returns the SoftHSM2 module path, creating the token in the
// test environment's directory (removed with it) on first use. A missing
// SoftHSM2 fails the test, as in package ca/hsm.
func hsmModule(t *testing.T) string {
	t.Helper()
	localcluster.SkipIfShort(t)
	return catest.SoftHSM(t, filepath.Join(env.Dir(), "softhsm"), hsmToken, hsmPIN, hsmSOPIN)
}

// hsmKey is a P-256 key pair generated on the token, and certificates
// for it that the token signed (or, for intermediate, root signed).
type hsmKey struct {
	label string
	// root is an offline root; intermediate, a CA of the token's key
	// (pathLen 1) that root issued.
	root         *catest.CA
	intermediate *x509.Certificate
	// selfSigned is a root of the token's key; notCA a self-signed
	// certificate without CA:true; expired a self-signed CA that expired
	// an hour ago.
	selfSigned, notCA, expired *x509.Certificate
}

// newHSMKey generates a key pair labelled label on the token and its
// certificates. Its PKCS#11 session is closed before it returns: while
// the process is logged in to the token, a second login is not checked
// against the PIN.
func newHSMKey(t *testing.T, label string) *hsmKey {
	t.Helper()
	module := hsmModule(t)
	k, err := kmspkcs11.New(context.Background(), apiv1.Options{
		Type: apiv1.PKCS11,
		URI:  fmt.Sprintf("pkcs11:module-path=%s;token=%s", module, hsmToken),
		Pin:  hsmPIN,
	})
	require.NoError(t, err)
	defer func() { require.NoError(t, k.Close()) }()
	id := make([]byte, 8)
	_, err = rand.Read(id)
	require.NoError(t, err)
	resp, err := k.CreateKey(&apiv1.CreateKeyRequest{Name: fmt.Sprintf("pkcs11:id=%s;object=%s", hex.EncodeToString(id), label), SignatureAlgorithm: apiv1.ECDSAWithSHA256})
	require.NoError(t, err)
	key, err := k.CreateSigner(&resp.CreateSignerRequest)
	require.NoError(t, err)

	now := time.Now()
	caTmpl := func(name string) *x509.Certificate {
		serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
		require.NoError(t, err)
		return &x509.Certificate{
			SerialNumber: serial.Add(serial, big.NewInt(1)), Subject: pkix.Name{Organization: []string{"relaymesh trust test"}, CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(30 * 24 * time.Hour),
			KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, BasicConstraintsValid: true, IsCA: true,
		}
	}
	selfSign := func(tmpl *x509.Certificate) *x509.Certificate {
		return createCert(t, tmpl, tmpl, resp.PublicKey, key)
	}
	out := &hsmKey{label: label, root: catest.NewRoot(t, catest.CAOptions{Name: "offline root of " + label})}
	inter := caTmpl("HSM intermediate " + label)
	inter.MaxPathLen = 1
	out.intermediate = createCert(t, inter, out.root.Cert, resp.PublicKey, out.root.Key)
	out.selfSigned = selfSign(caTmpl("HSM root " + label))
	notCA := caTmpl("HSM leaf " + label)
	notCA.IsCA, notCA.KeyUsage = false, x509.KeyUsageDigitalSignature
	out.notCA = selfSign(notCA)
	expired := caTmpl("HSM expired root " + label)
	expired.NotBefore, expired.NotAfter = now.Add(-48*time.Hour), now.Add(-time.Hour)
	out.expired = selfSign(expired)
	return out
}

func createCert(t *testing.T, tmpl, parent *x509.Certificate, pub crypto.PublicKey, key crypto.Signer) *x509.Certificate {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, key)
	require.NoError(t, err)
	c, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return c
}

// testVM is the VirtualMesh the back-end tests open roots for.
const testVM = "team-a/mesh"

// createSecret creates a Secret offered to every VirtualMesh.
func createSecret(t *testing.T, kube kubernetes.Interface, ns, name string, data map[string][]byte) *corev1.Secret {
	t.Helper()
	s, err := kube.CoreV1().Secrets(ns).Create(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
		Annotations: map[string]string{networkingv1alpha1.AnnotationVirtualMeshes: "*"}}, Data: data}, metav1.CreateOptions{})
	require.NoError(t, err)
	return s
}

// newController is a Controller of the server in ns that allows the
// PKCS#11 modules given, logging into the returned buffer.
func newController(kube kubernetes.Interface, ns string, modules ...string) (*trust.Controller, *bytes.Buffer) {
	var logs bytes.Buffer
	return trust.NewControllerForTest(trust.Config{Kube: kube, Namespace: ns, PKCS11Modules: modules,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}), &logs
}

// verifiesTo asserts that the intermediate's chain verifies to root and
// to nothing else the Issued names.
func verifiesTo(t *testing.T, iss *ca.Issued, root *x509.Certificate) {
	t.Helper()
	require.Equal(t, []*x509.Certificate{root}, iss.Roots)
	roots, inters := x509.NewCertPool(), x509.NewCertPool()
	roots.AddCert(root)
	for _, c := range iss.Chain {
		if !c.Equal(root) {
			inters.AddCert(c)
		}
	}
	_, err := iss.Certificate.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inters, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	require.NoError(t, err)
}

func closeSigner(t *testing.T, s ca.Signer) {
	t.Helper()
	c, ok := s.(io.Closer)
	require.True(t, ok, "a pkcs11 signer is an io.Closer")
	require.NoError(t, c.Close())
}

// TestPKCS11Root: a root whose key is on a real SoftHSM2 token, its PIN and
// certificates in Secrets of a real kube-apiserver, signs mesh
// intermediates that chain to the roots of the certificate Secret; the
// version is the Secrets' resourceVersions and follows their changes.
func TestPKCS11Root(t *testing.T) {
	ctx := context.Background()
	kube := client(t)
	ns := namespace(t, kube)
	module := hsmModule(t)
	k := newHSMKey(t, "trust-root")
	pin := createSecret(t, kube, ns, "hsm-pin", map[string][]byte{"pin": []byte(hsmPIN + "\n")})
	chained := createSecret(t, kube, ns, "hsm-intermediate", map[string][]byte{"tls.crt": ca.CertsPEM(k.intermediate), "ca.crt": k.root.RootsPEM()})
	selfSigned := createSecret(t, kube, ns, "hsm-root", map[string][]byte{"tls.crt": ca.CertsPEM(k.selfSigned)})
	ctl, logs := newController(kube, ns, "/usr/lib/other/libother.so", module)
	spec := func(cert *corev1.Secret) *networkingv1alpha1.PKCS11CA {
		return &networkingv1alpha1.PKCS11CA{ModulePath: module, TokenLabel: hsmToken, KeyLabel: k.label,
			PINSecretRef: common.ObjectRef{Name: pin.Name}, CertificateSecretRef: common.ObjectRef{Name: cert.Name, Namespace: ns}}
	}

	t.Run("an intermediate of an offline root (tls.crt and ca.crt)", func(t *testing.T) {
		s, v, err := trust.PKCS11Signer(ctl, ctx, testVM, spec(chained))
		require.NoError(t, err)
		defer closeSigner(t, s)
		assert.Equal(t, pin.ResourceVersion+","+chained.ResourceVersion, v)
		verifiesTo(t, catest.IssueIntermediate(t, s), k.root.Cert)
	})
	t.Run("a self-signed root (tls.crt only), module path not in clean form", func(t *testing.T) {
		p := spec(selfSigned)
		p.ModulePath = filepath.Dir(module) + "/./" + filepath.Base(module)
		s, v, err := trust.PKCS11Signer(ctl, ctx, testVM, p)
		require.NoError(t, err)
		defer closeSigner(t, s)
		assert.Equal(t, pin.ResourceVersion+","+selfSigned.ResourceVersion, v)
		verifiesTo(t, catest.IssueIntermediate(t, s), k.selfSigned)
	})
	t.Run("a changed Secret changes the version", func(t *testing.T) {
		s, before, err := trust.PKCS11Signer(ctl, ctx, testVM, spec(chained))
		require.NoError(t, err)
		closeSigner(t, s)
		pin.Annotations["rotated"] = "yes"
		_, err = kube.CoreV1().Secrets(ns).Update(ctx, pin, metav1.UpdateOptions{})
		require.NoError(t, err)
		s, after, err := trust.PKCS11Signer(ctl, ctx, testVM, spec(chained))
		require.NoError(t, err)
		closeSigner(t, s)
		assert.NotEqual(t, before, after)
	})
	assert.Contains(t, logs.String(), hsmToken, "the back end logs the token it opened")
	assert.NotContains(t, logs.String(), hsmPIN, "the PIN leaked into the log")
}

// TestPKCS11RootRejects: every way a rootCA.pkcs11 can be wrong fails with
// a message that says which, and never contains the PIN. Nothing has the
// token open meanwhile (see newHSMKey).
func TestPKCS11RootRejects(t *testing.T) {
	ctx := context.Background()
	kube := client(t)
	ns := namespace(t, kube)
	module := hsmModule(t)
	k := newHSMKey(t, "trust-rejects")
	other := catest.NewRoot(t, catest.CAOptions{Name: "root of another key"})
	secret := func(name string, data map[string][]byte) { createSecret(t, kube, ns, name, data) }
	secret("pin", map[string][]byte{"pin": []byte(hsmPIN)})
	secret("wrong-pin", map[string][]byte{"pin": []byte("wrong-" + hsmPIN)})
	secret("no-pin", map[string][]byte{"PIN": []byte(hsmPIN)})
	secret("cert", map[string][]byte{"tls.crt": ca.CertsPEM(k.intermediate), "ca.crt": k.root.RootsPEM()})
	secret("no-cert", map[string][]byte{"tls.key": []byte("not here")})
	secret("other-key", map[string][]byte{"tls.crt": ca.CertsPEM(other.Cert)})
	secret("not-ca", map[string][]byte{"tls.crt": ca.CertsPEM(k.notCA)})
	secret("expired", map[string][]byte{"tls.crt": ca.CertsPEM(k.expired)})
	secret("no-roots", map[string][]byte{"tls.crt": ca.CertsPEM(k.intermediate)})
	elsewhere := "default"
	for _, name := range []string{"pin-" + ns, "cert-" + ns} {
		createSecret(t, kube, elsewhere, name, map[string][]byte{"pin": []byte(hsmPIN), "tls.crt": ca.CertsPEM(k.selfSigned)})
	}

	tests := []struct {
		name    string
		modules []string
		modify  func(p *networkingv1alpha1.PKCS11CA)
		want    []string
	}{
		{"no module allowed", []string{}, nil, []string{"modulePath", "allows no PKCS#11 module", "--pkcs11-module " + module}},
		{"module not allowed", []string{"/usr/lib/other/libother.so"}, nil, []string{"modulePath", "is not a PKCS#11 module the server allows", "--pkcs11-module flags: /usr/lib/other/libother.so"}},
		{"relative module path", nil, func(p *networkingv1alpha1.PKCS11CA) { p.ModulePath = filepath.Base(module) }, []string{"modulePath", "must be an absolute path"}},
		{"PIN secret in another namespace", nil, func(p *networkingv1alpha1.PKCS11CA) {
			p.PINSecretRef = common.ObjectRef{Name: "pin-" + ns, Namespace: elsewhere}
		},
			[]string{"pinSecretRef must be in the server's namespace " + ns + ", not default"}},
		{"certificate secret in another namespace", nil, func(p *networkingv1alpha1.PKCS11CA) {
			p.CertificateSecretRef = common.ObjectRef{Name: "cert-" + ns, Namespace: elsewhere}
		}, []string{"certificateSecretRef must be in the server's namespace " + ns + ", not default"}},
		{"missing PIN secret", nil, func(p *networkingv1alpha1.PKCS11CA) { p.PINSecretRef.Name = "nope" }, []string{"pinSecretRef: secret " + ns + "/nope", "not found"}},
		{"missing certificate secret", nil, func(p *networkingv1alpha1.PKCS11CA) { p.CertificateSecretRef.Name = "nope" }, []string{"certificateSecretRef: secret " + ns + "/nope", "not found"}},
		{"PIN secret without key pin", nil, func(p *networkingv1alpha1.PKCS11CA) { p.PINSecretRef.Name = "no-pin" }, []string{"secret " + ns + "/no-pin has no (or an empty) key \"pin\""}},
		{"certificate secret without key tls.crt", nil, func(p *networkingv1alpha1.PKCS11CA) { p.CertificateSecretRef.Name = "no-cert" }, []string{"secret " + ns + "/no-cert has no (or an empty) key \"tls.crt\""}},
		{"wrong PIN", nil, func(p *networkingv1alpha1.PKCS11CA) { p.PINSecretRef.Name = "wrong-pin" }, []string{"wrong PIN", hsmToken, "PIN from secret " + ns + "/wrong-pin"}},
		{"no such key on the token", nil, func(p *networkingv1alpha1.PKCS11CA) { p.KeyLabel = "no-such-key" }, []string{"no key", `"no-such-key"`}},
		{"certificate of another key", nil, func(p *networkingv1alpha1.PKCS11CA) { p.CertificateSecretRef.Name = "other-key" },
			[]string{"the CA key does not belong to certificate", "root of another key", "certificates from secret " + ns + "/other-key"}},
		{"certificate that is not a CA", nil, func(p *networkingv1alpha1.PKCS11CA) { p.CertificateSecretRef.Name = "not-ca" }, []string{"is not a CA certificate"}},
		{"expired certificate", nil, func(p *networkingv1alpha1.PKCS11CA) { p.CertificateSecretRef.Name = "expired" }, []string{"HSM expired root", "expired at"}},
		{"an intermediate without ca.crt", nil, func(p *networkingv1alpha1.PKCS11CA) { p.CertificateSecretRef.Name = "no-roots" },
			[]string{"has no key ca.crt, so its tls.crt must be a single self-signed root", "is issued by"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			modules := tt.modules
			if modules == nil {
				modules = []string{module}
			}
			ctl, logs := newController(kube, ns, modules...)
			p := &networkingv1alpha1.PKCS11CA{ModulePath: module, TokenLabel: hsmToken, KeyLabel: k.label,
				PINSecretRef: common.ObjectRef{Name: "pin"}, CertificateSecretRef: common.ObjectRef{Name: "cert"}}
			if tt.modify != nil {
				tt.modify(p)
			}
			s, v, err := trust.PKCS11Signer(ctl, ctx, testVM, p)
			if s != nil {
				closeSigner(t, s)
			}
			require.Error(t, err)
			t.Logf("error: %v", err)
			assert.Nil(t, s)
			assert.Empty(t, v)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.NotContains(t, err.Error(), hsmPIN, "the PIN leaked into the error")
			assert.NotContains(t, logs.String(), hsmPIN, "the PIN leaked into the log")
		})
	}

	t.Run("the right configuration works after all that", func(t *testing.T) {
		ctl, _ := newController(kube, ns, module)
		s, _, err := trust.PKCS11Signer(ctl, ctx, testVM, &networkingv1alpha1.PKCS11CA{ModulePath: module, TokenLabel: hsmToken, KeyLabel: k.label,
			PINSecretRef: common.ObjectRef{Name: "pin"}, CertificateSecretRef: common.ObjectRef{Name: "cert"}})
		require.NoError(t, err)
		closeSigner(t, s)
	})
}

// TestExternalRootRejects: every way a rootCA.external or its configRef
// Secret can be wrong, short of the CA service itself, fails with a
// message that says which, and never contains a credential. Nothing here
// reaches a CA service.
func TestExternalRootRejects(t *testing.T) {
	ctx := context.Background()
	kube := client(t)
	ns := namespace(t, kube)
	root := catest.NewRoot(t, catest.CAOptions{Name: "external test root"})
	good := root.NewIntermediate(t, catest.CAOptions{Name: "external signing CA", MaxPathLen: 1})
	notCA := root.NewIntermediate(t, catest.CAOptions{Name: "external leaf", NotCA: true})
	expired := root.NewIntermediate(t, catest.CAOptions{Name: "external expired CA", NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	authKey := strings.Repeat("5e", 32)
	const password = "pw-91d0e4c7b2a6-trust"
	jwk, err := jose.GenerateJWK("EC", "P-256", "ES256", "sig", "", 0)
	require.NoError(t, err)
	enc, err := jose.EncryptJWK(jwk, []byte(password))
	require.NoError(t, err)
	encKey, err := enc.CompactSerialize()
	require.NoError(t, err)
	privJSON, err := json.Marshal(jwk)
	require.NoError(t, err)

	cfssl := func(chain *catest.CA, key string) map[string][]byte {
		return map[string][]byte{"authKey": []byte(key), "chain.pem": chain.ChainPEM(), "roots.pem": chain.RootsPEM()}
	}
	secret := func(name string, data map[string][]byte) { createSecret(t, kube, ns, name, data) }
	secret("empty", map[string][]byte{"unrelated": []byte("x")})
	secret("cfssl-not-ca", cfssl(notCA, authKey))
	secret("cfssl-not-hex", cfssl(good, "zz"+authKey[2:]))
	secret("stepca-expired", map[string][]byte{"provisioner": []byte("p"), "provisionerKey": privJSON, "chain.pem": expired.ChainPEM(), "roots.pem": expired.RootsPEM()})
	secret("stepca-wrong-password", map[string][]byte{"provisioner": []byte("p"), "provisionerKey": []byte(encKey), "provisionerPassword": []byte("wrong-" + password),
		"chain.pem": good.ChainPEM(), "roots.pem": good.RootsPEM()})
	secret("stepca-no-password", map[string][]byte{"provisioner": []byte("p"), "provisionerKey": []byte(encKey), "chain.pem": good.ChainPEM(), "roots.pem": good.RootsPEM()})
	createSecret(t, kube, "default", "cfssl-"+ns, cfssl(good, authKey))

	tests := []struct {
		name string
		spec networkingv1alpha1.ExternalCA
		want []string
	}{
		{"unknown provider", networkingv1alpha1.ExternalCA{Provider: "vault", URL: "https://vault.example.test", ConfigRef: common.ObjectRef{Name: "empty"}},
			[]string{`spec.mtls.shared.rootCA.external.provider "vault" is not one of cfssl, stepca`}},
		{"configRef in another namespace", networkingv1alpha1.ExternalCA{Provider: "cfssl", URL: "http://127.0.0.1:1", ConfigRef: common.ObjectRef{Name: "cfssl-" + ns, Namespace: "default"}},
			[]string{"configRef must be in the server's namespace " + ns + ", not default"}},
		{"missing configRef secret", networkingv1alpha1.ExternalCA{Provider: "stepca", URL: "https://127.0.0.1:1", ConfigRef: common.ObjectRef{Name: "nope"}},
			[]string{"configRef: secret " + ns + "/nope", "not found"}},
		{"cfssl: missing keys", networkingv1alpha1.ExternalCA{Provider: "cfssl", URL: "http://127.0.0.1:1", ConfigRef: common.ObjectRef{Name: "empty"}},
			[]string{"configRef: secret " + ns + `/empty has no (or an empty) key "authKey", "chain.pem", "roots.pem"`}},
		{"stepca: missing keys", networkingv1alpha1.ExternalCA{Provider: "stepca", URL: "https://127.0.0.1:1", ConfigRef: common.ObjectRef{Name: "empty", Namespace: ns}},
			[]string{"configRef: secret " + ns + `/empty has no (or an empty) key "provisioner", "provisionerKey", "chain.pem", "roots.pem"`}},
		{"cfssl: chain.pem is not a CA", networkingv1alpha1.ExternalCA{Provider: "cfssl", URL: "http://127.0.0.1:1", ConfigRef: common.ObjectRef{Name: "cfssl-not-ca"}},
			[]string{"external leaf", "is not a CA certificate", "secret " + ns + "/cfssl-not-ca"}},
		{"cfssl: authKey is not hex", networkingv1alpha1.ExternalCA{Provider: "cfssl", URL: "http://127.0.0.1:1", ConfigRef: common.ObjectRef{Name: "cfssl-not-hex"}},
			[]string{"auth key (from field authKey) is not hex"}},
		{"cfssl: plain http off loopback", networkingv1alpha1.ExternalCA{Provider: "cfssl", URL: "http://cfssl.example.test", ConfigRef: common.ObjectRef{Name: "cfssl-not-hex"}},
			[]string{"plain http is only allowed to a loopback host"}},
		{"stepca: chain.pem expired", networkingv1alpha1.ExternalCA{Provider: "stepca", URL: "https://127.0.0.1:1", ConfigRef: common.ObjectRef{Name: "stepca-expired"}},
			[]string{"external expired CA", "expired at"}},
		{"stepca: wrong provisionerPassword", networkingv1alpha1.ExternalCA{Provider: "stepca", URL: "https://127.0.0.1:1", ConfigRef: common.ObjectRef{Name: "stepca-wrong-password"}},
			[]string{"wrong password (provisionerPassword)"}},
		{"stepca: encrypted provisionerKey without provisionerPassword", networkingv1alpha1.ExternalCA{Provider: "stepca", URL: "https://127.0.0.1:1", ConfigRef: common.ObjectRef{Name: "stepca-no-password"}},
			[]string{"the key is encrypted and no provisionerPasswordFile or provisionerPassword is set"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctl, logs := newController(kube, ns)
			s, v, err := trust.ExternalSigner(ctl, ctx, testVM, &tt.spec)
			require.Error(t, err)
			t.Logf("error: %v", err)
			assert.Nil(t, s)
			assert.Empty(t, v)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
			for _, secret := range []string{authKey, authKey[2:], password, string(privJSON), catest.JWKPrivateD(t, jwk)} {
				assert.NotContains(t, err.Error(), secret, "a secret leaked into the error")
				assert.NotContains(t, logs.String(), secret, "a secret leaked into the log")
			}
		})
	}
}

// TestExternalRootCFSSL: a real `cfssl serve`, configured from a Secret of
// a real kube-apiserver, signs mesh intermediates that chain to roots.pem,
// with the default intermediate profile or the one the Secret names.
func TestExternalRootCFSSL(t *testing.T) {
	ctx := context.Background()
	kube := client(t)
	ns := namespace(t, kube)
	srv := startCFSSL(t)
	data := func(extra ...string) map[string][]byte {
		d := map[string][]byte{"authKey": []byte(srv.authKey + "\n"), "chain.pem": srv.issuing.ChainPEM(), "roots.pem": srv.issuing.RootsPEM()}
		for i := 0; i+1 < len(extra); i += 2 {
			d[extra[i]] = []byte(extra[i+1])
		}
		return d
	}
	defaults := createSecret(t, kube, ns, "cfssl", data())
	named := createSecret(t, kube, ns, "cfssl-named-profile", data("profile", "mesh-intermediate"))
	createSecret(t, kube, ns, "cfssl-unknown-profile", data("profile", "nope"))
	createSecret(t, kube, ns, "cfssl-wrong-key", data("authKey", strings.Repeat("ab", 32)))
	ctl, logs := newController(kube, ns)
	spec := func(name string) *networkingv1alpha1.ExternalCA {
		return &networkingv1alpha1.ExternalCA{Provider: "cfssl", URL: srv.url, ConfigRef: common.ObjectRef{Name: name}}
	}

	for _, sec := range []*corev1.Secret{defaults, named} {
		t.Run(sec.Name, func(t *testing.T) {
			s, v, err := trust.ExternalSigner(ctl, ctx, testVM, spec(sec.Name))
			require.NoError(t, err)
			assert.Equal(t, sec.ResourceVersion, v)
			verifiesTo(t, catest.IssueIntermediate(t, s), srv.issuing.Root().Cert)
		})
	}
	for name, want := range map[string]string{
		"cfssl-unknown-profile": `profile "nope" (profiles.intermediate)`,
		"cfssl-wrong-key":       "cfssl refused the authentication key",
	} {
		t.Run(name, func(t *testing.T) {
			s, _, err := trust.ExternalSigner(ctl, ctx, testVM, spec(name))
			require.Error(t, err)
			t.Logf("error: %v", err)
			assert.Nil(t, s)
			assert.ErrorContains(t, err, want)
			assert.NotContains(t, err.Error(), srv.authKey)
			assert.NotContains(t, err.Error(), strings.Repeat("ab", 32))
		})
	}
	assert.NotContains(t, logs.String(), srv.authKey, "the auth key leaked into the log")
	assert.NotContains(t, srv.proc.Log(t), srv.authKey, "the auth key leaked into cfssl's log")
}

// TestExternalRootStepCA: a real step-ca, configured from a Secret of a
// real kube-apiserver (the provisioner key encrypted, as ca.json keeps
// it, with its password), signs mesh intermediates that chain to
// roots.pem; tlsRoots.pem, when set, is the only trust for HTTPS.
func TestExternalRootStepCA(t *testing.T) {
	ctx := context.Background()
	kube := client(t)
	ns := namespace(t, kube)
	srv := startStepCA(t)
	priv, err := json.Marshal(srv.key)
	require.NoError(t, err)
	sec := createSecret(t, kube, ns, "stepca", map[string][]byte{
		"provisioner": []byte(stepCAProvisioner), "provisionerKey": []byte(srv.encryptedKey), "provisionerPassword": []byte(srv.password + "\n"),
		"chain.pem": srv.issuing.ChainPEM(), "roots.pem": srv.issuing.RootsPEM(),
	})
	createSecret(t, kube, ns, "stepca-other-tls-roots", map[string][]byte{
		"provisioner": []byte(stepCAProvisioner), "provisionerKey": priv,
		"chain.pem": srv.issuing.ChainPEM(), "roots.pem": srv.issuing.RootsPEM(), "tlsRoots.pem": catest.NewRoot(t, catest.CAOptions{}).RootsPEM(),
	})
	ctl, logs := newController(kube, ns)
	spec := func(name string) *networkingv1alpha1.ExternalCA {
		return &networkingv1alpha1.ExternalCA{Provider: "stepca", URL: srv.url, ConfigRef: common.ObjectRef{Name: name}}
	}

	s, v, err := trust.ExternalSigner(ctl, ctx, testVM, spec(sec.Name))
	require.NoError(t, err)
	assert.Equal(t, sec.ResourceVersion, v)
	verifiesTo(t, catest.IssueIntermediate(t, s), srv.issuing.Root().Cert)

	s, _, err = trust.ExternalSigner(ctl, ctx, testVM, spec("stepca-other-tls-roots"))
	require.Error(t, err)
	t.Logf("error: %v", err)
	assert.Nil(t, s)
	assert.ErrorContains(t, err, "certificate signed by unknown authority")
	for _, secret := range []string{srv.password, string(priv), catest.JWKPrivateD(t, srv.key)} {
		assert.NotContains(t, err.Error(), secret, "a secret leaked into the error")
		assert.NotContains(t, logs.String(), secret, "a secret leaked into the log")
		assert.NotContains(t, srv.proc.Log(t), secret, "a secret leaked into step-ca's log")
	}
}

// cfsslServer is a running `cfssl serve`.
type cfsslServer struct {
	url     string
	authKey string // hex
	issuing *catest.CA
	proc    *catest.Process
}

// startCFSSL starts `cfssl serve` on a free loopback port (plain http),
// signing with a fresh CA under a fresh root, with the profiles the back
// end requires (the intermediate one also as mesh-intermediate), all
// authenticated with one auth key.
func startCFSSL(t *testing.T) *cfsslServer {
	t.Helper()
	bin := catest.Binary(t, "cfssl")
	dir := t.TempDir()
	// cfssl does not clamp to its CA: the CA must outlive a one-year
	// intermediate. pathLen 1 leaves room for one.
	twoYears := time.Now().Add(2 * 365 * 24 * time.Hour)
	root := catest.NewRoot(t, catest.CAOptions{Name: "cfssl trust test root", NotAfter: twoYears})
	srv := &cfsslServer{issuing: root.NewIntermediate(t, catest.CAOptions{Name: "cfssl trust test CA", MaxPathLen: 1, NotAfter: twoYears})}
	key := make([]byte, 32)
	_, err := rand.Read(key)
	require.NoError(t, err)
	srv.authKey = hex.EncodeToString(key)
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, data, 0o600))
		return p
	}
	authKeyFile := write("auth.key", []byte(srv.authKey))
	caFile, caKeyFile := write("ca.pem", ca.CertsPEM(srv.issuing.Cert)), write("ca-key.pem", srv.issuing.KeyPEM(t))
	// Only the public key comes from the request; expiries are the
	// Authority's default lifetimes.
	profile := func(expiry string, usages ...string) map[string]any {
		return map[string]any{"usages": usages, "expiry": expiry, "backdate": "1m", "auth_key": "relaymesh",
			"CSRWhitelist": map[string]bool{"PublicKey": true, "PublicKeyAlgorithm": true}}
	}
	intermediate := profile("8760h", "cert sign", "crl sign")
	intermediate["ca_constraint"] = map[string]any{"is_ca": true, "max_path_len": 0, "max_path_len_zero": true}
	// The name constraints come from the agent's request: cfssl copies
	// request extensions only without a CSRWhitelist.
	intermediate["copy_extensions"] = true
	delete(intermediate, "CSRWhitelist")
	cfg, err := json.Marshal(map[string]any{
		"signing": map[string]any{
			"default": profile("1h", "digital signature", "client auth"),
			"profiles": map[string]any{
				"relaymesh-client":       profile("24h", "digital signature", "client auth"),
				"relaymesh-server":       profile("720h", "digital signature", "server auth"),
				"relaymesh-server-rsa":   profile("720h", "digital signature", "key encipherment", "server auth"),
				"relaymesh-intermediate": intermediate,
				"mesh-intermediate":      intermediate,
			},
		},
		// cfssl reads the key from the file: it is in no command line.
		"auth_keys": map[string]any{"relaymesh": map[string]string{"type": "standard", "key": "file:" + authKeyFile}},
	})
	require.NoError(t, err)
	cfgFile := write("config.json", cfg)
	srv.proc, srv.url = catest.StartServer(t, catest.Server{
		Name: "cfssl", Bin: bin, Dir: dir, Scheme: "http", Health: "/api/v1/cfssl/health",
		Args: func(addr string) []string {
			host, port, err := net.SplitHostPort(addr)
			require.NoError(t, err)
			return []string{"serve", "-address", host, "-port", port, "-ca", caFile, "-ca-key", caKeyFile, "-config", cfgFile, "-loglevel", "1"}
		},
	})
	return srv
}

// stepCAProvisioner is the JWK provisioner of the test step-ca.
const stepCAProvisioner = "relaymesh"

// stepCAServer is a running step-ca.
type stepCAServer struct {
	url     string
	issuing *catest.CA
	// key is the provisioner's private JWK; encryptedKey the same key
	// encrypted with password, as ca.json keeps it.
	key                    *jose.JSONWebKey
	encryptedKey, password string
	proc                   *catest.Process
}

// startStepCA starts step-ca on a free loopback port with a fresh root,
// intermediate and JWK provisioner that uses stepca.ProvisionerTemplate,
// and no database.
func startStepCA(t *testing.T) *stepCAServer {
	t.Helper()
	bin := catest.Binary(t, "step-ca")
	dir := t.TempDir()
	root := catest.NewRoot(t, catest.CAOptions{Name: "step-ca trust test root"})
	srv := &stepCAServer{issuing: root.NewIntermediate(t, catest.CAOptions{Name: "step-ca trust test intermediate", MaxPathLen: 1}), password: "pw-0b7d3f19c6e2-trust"}
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, data, 0o600))
		return p
	}
	crt, rootFile, key := write("intermediate.pem", srv.issuing.ChainPEM()), write("root.pem", srv.issuing.RootsPEM()), write("intermediate-key.pem", srv.issuing.KeyPEM(t))
	jwk, err := jose.GenerateJWK("EC", "P-256", "ES256", "sig", "", 0)
	require.NoError(t, err)
	srv.key = jwk
	enc, err := jose.EncryptJWK(jwk, []byte(srv.password))
	require.NoError(t, err)
	srv.encryptedKey, err = enc.CompactSerialize()
	require.NoError(t, err)
	pub := jwk.Public()
	pool := x509.NewCertPool()
	pool.AddCert(root.Cert)
	args := func(addr string) []string {
		host, _, err := net.SplitHostPort(addr)
		require.NoError(t, err)
		cfg, err := json.Marshal(map[string]any{
			"root": rootFile, "crt": crt, "key": key, "address": addr, "dnsNames": []string{host},
			"logger": map[string]string{"format": "text"}, "db": nil,
			"authority": map[string]any{"provisioners": []map[string]any{{
				"type": "JWK", "name": stepCAProvisioner, "key": &pub, "encryptedKey": srv.encryptedKey,
				"claims": map[string]any{"minTLSCertDuration": "5s", "maxTLSCertDuration": "8760h", "defaultTLSCertDuration": "24h",
					"disableRenewal": true, "disableSmallstepExtensions": true},
				"options": map[string]any{"x509": map[string]any{"template": stepca.ProvisionerTemplate}},
			}}},
			"tls": map[string]any{"minVersion": 1.2, "maxVersion": 1.3},
		})
		require.NoError(t, err)
		return []string{write("ca.json", cfg)}
	}
	srv.proc, srv.url = catest.StartServer(t, catest.Server{Name: "step-ca", Bin: bin, Dir: dir, Args: args, Scheme: "https", Health: "/health", Roots: pool})
	return srv
}

// A Secret serves only the VirtualMeshes its relaymesh.io/virtualmeshes
// annotation lists: the owner of a root or of CA credentials decides who
// may use them, not the VirtualMeshes' authors.
func TestRootSecretsMustBeOffered(t *testing.T) {
	ctx := context.Background()
	kube := client(t)
	ns := namespace(t, kube)
	ctl, _ := newController(kube, ns)
	spec := func(name string) *networkingv1alpha1.ExternalCA {
		return &networkingv1alpha1.ExternalCA{Provider: "cfssl", URL: "https://127.0.0.1:1", ConfigRef: common.ObjectRef{Name: name}}
	}
	data := map[string][]byte{"authKey": []byte("00"), "chain.pem": []byte("x"), "roots.pem": []byte("x")}
	for _, tc := range []struct {
		name, annotation string
		offered          bool
	}{
		{"no-annotation", "", false},
		{"other-vm", "team-b/mesh", false},
		{"prefix-only", "team-a/mesh-2, team-a", false},
		{"listed", "team-b/mesh, " + testVM, true},
		{"everyone", "*", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			meta := metav1.ObjectMeta{Name: "creds-" + tc.name, Namespace: ns}
			if tc.annotation != "" {
				meta.Annotations = map[string]string{networkingv1alpha1.AnnotationVirtualMeshes: tc.annotation}
			}
			_, err := kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: meta, Data: data}, metav1.CreateOptions{})
			require.NoError(t, err)
			_, _, err = trust.ExternalSigner(ctl, ctx, testVM, spec(meta.Name))
			require.Error(t, err, "the chain is not PEM either way")
			if tc.offered {
				assert.NotContains(t, err.Error(), "not offered")
			} else {
				assert.Contains(t, err.Error(), "is not offered to VirtualMesh "+testVM)
				assert.Contains(t, err.Error(), networkingv1alpha1.AnnotationVirtualMeshes)
			}
		})
	}
}
