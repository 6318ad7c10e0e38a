package trust_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"math/big"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.step.sm/crypto/pemutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// testRoot is a root CA the tests sign intermediates with, as the server
// would.
type testRoot struct {
	cert *x509.Certificate
	key  crypto.Signer
	pem  []byte
}

func newRoot(t *testing.T, name string) *testRoot {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true, MaxPathLen: 1, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &testRoot{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// sign issues an intermediate for the CSR; mutate lets a test make the
// answer hostile.
func (r *testRoot) sign(t *testing.T, csrPEM []byte, ttl time.Duration, mutate func(*x509.Certificate, *crypto.PublicKey)) []byte {
	t.Helper()
	csr, err := pemutil.ParseCertificateRequest(csrPEM)
	require.NoError(t, err)
	var pub crypto.PublicKey = csr.PublicKey
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "mesh intermediate"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(ttl), IsCA: true, BasicConstraintsValid: true,
		MaxPathLen: 0, MaxPathLenZero: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	if mutate != nil {
		mutate(tmpl, &pub)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, r.cert, pub, r.key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

var env *localcluster.Env

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		// -short (make test-unit): no apiserver; client skips every test
		// that needs one.
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "trust-test-")
	if err != nil {
		panic(err)
	}
	env, err = localcluster.Start(context.Background(), localcluster.Config{Dir: dir, Clusters: []string{"cluster-1"}})
	if err != nil {
		panic(err)
	}
	code := m.Run()
	if err := env.Stop(); err != nil {
		code = 1
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func client(t testing.TB) kubernetes.Interface {
	t.Helper()
	localcluster.SkipIfShort(t)
	c, err := env.Cluster("cluster-1").Clientset()
	require.NoError(t, err)
	return c
}

func namespace(t testing.TB, c kubernetes.Interface) string {
	t.Helper()
	ns := strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	ns = strings.ReplaceAll(ns, "_", "-")
	if len(ns) > 60 {
		ns = ns[:60]
	}
	_, err := c.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return ns
}

func request(ns string, root *testRoot) *relaypb.TrustRequest {
	return &relaypb.TrustRequest{Mesh: "istiod-" + ns, Namespace: ns, VirtualMesh: "relaymesh/vm", RootBundle: root.pem,
		Issuer: trust.Fingerprint(root.cert), RenewAtPercent: 66}
}

// The agent generates the key, sends a CSR, checks the answer and writes
// Istio's cacerts; the next pass changes nothing; near expiry it renews.
func TestAgentWritesAndRenewsCACerts(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	ns := namespace(t, c)
	root := newRoot(t, "root-1")
	now := time.Now()
	a := &trust.Agent{Client: c, Owner: "relaymesh-agent", Clock: func() time.Time { return now }}
	var calls atomic.Int32
	sign := func(_ context.Context, req *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
		calls.Add(1)
		assert.Equal(t, "istiod-"+ns, req.GetMesh())
		return &relaypb.IntermediateResponse{CertificateChain: root.sign(t, req.GetCsr(), 3*time.Hour, nil), RootBundle: root.pem, Issuer: trust.Fingerprint(root.cert)}, nil
	}
	set := &relaypb.OutputSet{Trust: []*relaypb.TrustRequest{request(ns, root)}}

	results, next := a.Apply(ctx, set, sign)
	require.Len(t, results, 1)
	assert.Equal(t, "applied", results[0].GetOutcome(), results[0].GetError())
	s, err := c.CoreV1().Secrets(ns).Get(ctx, trust.SecretName, metav1.GetOptions{})
	require.NoError(t, err)
	for _, k := range []string{trust.KeyCACert, trust.KeyCAKey, trust.KeyChain, trust.KeyRootCert} {
		assert.NotEmpty(t, s.Data[k], k)
	}
	assert.Equal(t, root.pem, s.Data[trust.KeyRootCert])
	inter, err := pemutil.ParseCertificate(s.Data[trust.KeyCACert])
	require.NoError(t, err)
	key, err := pemutil.ParseKey(s.Data[trust.KeyCAKey])
	require.NoError(t, err)
	assert.True(t, inter.PublicKey.(*ecdsa.PublicKey).Equal(key.(crypto.Signer).Public()), "ca-key.pem is the key of ca-cert.pem")
	chain, err := pemutil.ParseCertificateBundle(s.Data[trust.KeyChain])
	require.NoError(t, err)
	require.Len(t, chain, 2, "cert-chain.pem: the intermediate, then the root")
	assert.True(t, chain[1].Equal(root.cert))
	assert.WithinDuration(t, inter.NotBefore.Add(inter.NotAfter.Sub(inter.NotBefore)*66/100), next, time.Second, "renewal at 66%% of its life")

	results, _ = a.Apply(ctx, set, sign)
	assert.Equal(t, "unchanged", results[0].GetOutcome())
	assert.Equal(t, int32(1), calls.Load(), "a current CA is not re-signed")

	now = next.Add(time.Second)
	results, _ = a.Apply(ctx, set, sign)
	assert.Equal(t, "applied", results[0].GetOutcome())
	assert.Equal(t, int32(2), calls.Load(), "renewed once 66% of its life was gone")

	// A new root (rotation) is a new intermediate with the new bundle.
	root2 := newRoot(t, "root-2")
	bundle := append(append([]byte(nil), root.pem...), root2.pem...)
	req := request(ns, root2)
	req.RootBundle = bundle
	results, _ = a.Apply(ctx, &relaypb.OutputSet{Trust: []*relaypb.TrustRequest{req}}, func(_ context.Context, r *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
		return &relaypb.IntermediateResponse{CertificateChain: root2.sign(t, r.GetCsr(), 3*time.Hour, nil), RootBundle: bundle, Issuer: trust.Fingerprint(root2.cert)}, nil
	})
	assert.Equal(t, "applied", results[0].GetOutcome(), results[0].GetError())
	s, err = c.CoreV1().Secrets(ns).Get(ctx, trust.SecretName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, bundle, s.Data[trust.KeyRootCert])

	// No longer asked for: the agent's own cacerts is deleted.
	results, _ = a.Apply(ctx, &relaypb.OutputSet{}, sign)
	require.Len(t, results, 1)
	assert.Equal(t, "pruned", results[0].GetOutcome())
	_, err = c.CoreV1().Secrets(ns).Get(ctx, trust.SecretName, metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err))
}

// A cacerts someone plugged in by hand is never changed or deleted.
func TestAgentLeavesForeignCACerts(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	ns := namespace(t, c)
	foreign := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: trust.SecretName, Namespace: ns}, Data: map[string][]byte{"ca-cert.pem": []byte("theirs")}}
	_, err := c.CoreV1().Secrets(ns).Create(ctx, foreign, metav1.CreateOptions{})
	require.NoError(t, err)
	root := newRoot(t, "root")
	a := &trust.Agent{Client: c, Owner: "relaymesh-agent"}
	sign := func(context.Context, *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
		t.Fatal("no CSR may be sent for a foreign cacerts")
		return nil, nil
	}
	results, _ := a.Apply(ctx, &relaypb.OutputSet{Trust: []*relaypb.TrustRequest{request(ns, root)}}, sign)
	require.Len(t, results, 1)
	assert.Equal(t, "conflict", results[0].GetOutcome())
	assert.Contains(t, results[0].GetError(), "not managed by Relaymesh")

	results, _ = a.Apply(ctx, &relaypb.OutputSet{}, sign)
	assert.Empty(t, results, "a foreign cacerts is not pruned")
	s, err := c.CoreV1().Secrets(ns).Get(ctx, trust.SecretName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "theirs", string(s.Data["ca-cert.pem"]))
}

// Whatever a (compromised or buggy) server answers, the agent writes only an
// intermediate CA limited to path length 0, for its own key, chaining to the
// root it was asked for.
func TestAgentRefusesBadAnswers(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	root, other := newRoot(t, "root"), newRoot(t, "other")
	for _, tc := range []struct {
		name   string
		answer func(t *testing.T, csr []byte) *relaypb.IntermediateResponse
		want   string
	}{
		{"another key", func(t *testing.T, csr []byte) *relaypb.IntermediateResponse {
			k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			return &relaypb.IntermediateResponse{CertificateChain: root.sign(t, csr, time.Hour, func(_ *x509.Certificate, p *crypto.PublicKey) { *p = k.Public() }), RootBundle: root.pem, Issuer: trust.Fingerprint(root.cert)}
		}, "not for the key we generated"},
		{"not a CA", func(t *testing.T, csr []byte) *relaypb.IntermediateResponse {
			return &relaypb.IntermediateResponse{CertificateChain: root.sign(t, csr, time.Hour, func(c *x509.Certificate, _ *crypto.PublicKey) { c.IsCA, c.MaxPathLenZero = false, false }), RootBundle: root.pem, Issuer: trust.Fingerprint(root.cert)}
		}, "not a CA limited to path length 0"},
		{"longer path", func(t *testing.T, csr []byte) *relaypb.IntermediateResponse {
			return &relaypb.IntermediateResponse{CertificateChain: root.sign(t, csr, time.Hour, func(c *x509.Certificate, _ *crypto.PublicKey) { c.MaxPathLen, c.MaxPathLenZero = 1, false }), RootBundle: root.pem, Issuer: trust.Fingerprint(root.cert)}
		}, "not a CA limited to path length 0"},
		{"signed by another root", func(t *testing.T, csr []byte) *relaypb.IntermediateResponse {
			return &relaypb.IntermediateResponse{CertificateChain: other.sign(t, csr, time.Hour, nil), RootBundle: root.pem, Issuer: trust.Fingerprint(root.cert)}
		}, "does not chain to the requested root"},
		{"another bundle", func(t *testing.T, csr []byte) *relaypb.IntermediateResponse {
			return &relaypb.IntermediateResponse{CertificateChain: other.sign(t, csr, time.Hour, nil), RootBundle: other.pem, Issuer: trust.Fingerprint(other.cert)}
		}, "names another root bundle"},
		{"garbage", func(*testing.T, []byte) *relaypb.IntermediateResponse {
			return &relaypb.IntermediateResponse{CertificateChain: []byte("-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n"), RootBundle: root.pem, Issuer: trust.Fingerprint(root.cert)}
		}, "not PEM certificates"},
		{"oversized", func(*testing.T, []byte) *relaypb.IntermediateResponse {
			return &relaypb.IntermediateResponse{CertificateChain: make([]byte, 300<<10), RootBundle: root.pem, Issuer: trust.Fingerprint(root.cert)}
		}, "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := namespace(t, c)
			a := &trust.Agent{Client: c, Owner: "relaymesh-agent"}
			results, next := a.Apply(ctx, &relaypb.OutputSet{Trust: []*relaypb.TrustRequest{request(ns, root)}},
				func(_ context.Context, r *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
					return tc.answer(t, r.GetCsr()), nil
				})
			require.Len(t, results, 1)
			assert.Equal(t, "error", results[0].GetOutcome())
			assert.Contains(t, results[0].GetError(), tc.want)
			assert.False(t, next.IsZero(), "it tries again")
			_, err := c.CoreV1().Secrets(ns).Get(ctx, trust.SecretName, metav1.GetOptions{})
			assert.True(t, apierrors.IsNotFound(err), "nothing written")
		})
	}
}

// With a trust domain in the request, the agent asks for its name
// constraints in the CSR, refuses an intermediate constrained otherwise (or
// not at all), and replaces a CA written before the request named one.
func TestAgentRequiresTheTrustDomainsConstraints(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	root := newRoot(t, "root")
	constrain := func(td string) func(*x509.Certificate, *crypto.PublicKey) {
		return func(c *x509.Certificate, _ *crypto.PublicKey) {
			c.PermittedURIDomains, c.ExcludedURIDomains, c.PermittedDNSDomainsCritical = []string{td}, []string{"." + td}, true
		}
	}
	answer := func(mutate func(*x509.Certificate, *crypto.PublicKey)) trust.SignFunc {
		return func(_ context.Context, r *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
			return &relaypb.IntermediateResponse{CertificateChain: root.sign(t, r.GetCsr(), time.Hour, mutate), RootBundle: root.pem, Issuer: trust.Fingerprint(root.cert)}, nil
		}
	}
	for _, tc := range []struct {
		name   string
		mutate func(*x509.Certificate, *crypto.PublicKey)
		want   string
	}{
		{"unconstrained", nil, `not constrained to trust domain "c1.local"`},
		{"another trust domain", constrain("c2.local"), `not constrained to trust domain "c1.local" (it permits URIs of ["c2.local"])`},
		{"subdomains allowed", func(c *x509.Certificate, p *crypto.PublicKey) {
			constrain("c1.local")(c, p)
			c.ExcludedURIDomains = nil
		}, "not constrained"},
		{"not critical", func(c *x509.Certificate, p *crypto.PublicKey) {
			constrain("c1.local")(c, p)
			c.PermittedDNSDomainsCritical = false
		}, "not constrained"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := namespace(t, c)
			req := request(ns, root)
			req.TrustDomain = "c1.local"
			a := &trust.Agent{Client: c, Owner: "relaymesh-agent"}
			results, _ := a.Apply(ctx, &relaypb.OutputSet{Trust: []*relaypb.TrustRequest{req}}, answer(tc.mutate))
			require.Len(t, results, 1)
			assert.Equal(t, "error", results[0].GetOutcome())
			assert.Contains(t, results[0].GetError(), tc.want)
			_, err := c.CoreV1().Secrets(ns).Get(ctx, trust.SecretName, metav1.GetOptions{})
			assert.True(t, apierrors.IsNotFound(err), "nothing written")
		})
	}

	t.Run("the request asks for the constraints; an older CA is replaced", func(t *testing.T) {
		ns := namespace(t, c)
		a := &trust.Agent{Client: c, Owner: "relaymesh-agent"}
		// Written for a request without a trust domain (an older server).
		results, _ := a.Apply(ctx, &relaypb.OutputSet{Trust: []*relaypb.TrustRequest{request(ns, root)}}, answer(nil))
		require.Equal(t, "applied", results[0].GetOutcome(), results[0].GetError())

		req := request(ns, root)
		req.TrustDomain = "c1.local"
		want, err := ca.NameConstraintsRequest("c1.local")
		require.NoError(t, err)
		var asked bool
		results, _ = a.Apply(ctx, &relaypb.OutputSet{Trust: []*relaypb.TrustRequest{req}}, func(ctx context.Context, r *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
			csr, err := pemutil.ParseCertificateRequest(r.GetCsr())
			require.NoError(t, err)
			require.Len(t, csr.Extensions, 1)
			assert.Equal(t, want, csr.Extensions[0], "the CSR asks for exactly the trust domain's constraints")
			asked = true
			return answer(constrain("c1.local"))(ctx, r)
		})
		require.True(t, asked, "the unconstrained CA was replaced")
		require.Equal(t, "applied", results[0].GetOutcome(), results[0].GetError())
		s, err := c.CoreV1().Secrets(ns).Get(ctx, trust.SecretName, metav1.GetOptions{})
		require.NoError(t, err)
		cert, err := pemutil.ParseCertificate(s.Data[trust.KeyCACert])
		require.NoError(t, err)
		assert.Equal(t, []string{"c1.local"}, cert.PermittedURIDomains)

		// The next pass keeps it.
		results, _ = a.Apply(ctx, &relaypb.OutputSet{Trust: []*relaypb.TrustRequest{req}}, answer(nil))
		assert.Equal(t, "unchanged", results[0].GetOutcome(), results[0].GetError())
	})
}

// A CrossSigned step asks for the intermediate signed by a second root:
// the agent writes both into cert-chain.pem (root-cert.pem keeps the one
// root), and refuses an answer without the second signature, with one it
// did not ask for, or with one for another key, subject, root or path
// length, writing nothing.
func TestAgentChecksTheSecondSignature(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	root, second, other := newRoot(t, "root"), newRoot(t, "second"), newRoot(t, "other")
	crossReq := func(ns string) *relaypb.TrustRequest {
		req := request(ns, root)
		req.CrossIssuer, req.CrossRoot = trust.Fingerprint(second.cert), second.pem
		return req
	}
	answer := func(t *testing.T, csr []byte, cross []byte) *relaypb.IntermediateResponse {
		return &relaypb.IntermediateResponse{CertificateChain: root.sign(t, csr, time.Hour, nil), RootBundle: root.pem,
			Issuer: trust.Fingerprint(root.cert), CrossCertificateChain: cross}
	}
	t.Run("accepted", func(t *testing.T) {
		ns := namespace(t, c)
		a := &trust.Agent{Client: c, Owner: "cross-" + ns[len(ns)-min(len(ns), 40):]}
		set := &relaypb.OutputSet{Trust: []*relaypb.TrustRequest{crossReq(ns)}}
		sign := func(_ context.Context, r *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
			return answer(t, r.GetCsr(), second.sign(t, r.GetCsr(), time.Hour, nil)), nil
		}
		results, _ := a.Apply(ctx, set, sign)
		require.Equal(t, "applied", results[0].GetOutcome(), results[0].GetError())
		s, err := c.CoreV1().Secrets(ns).Get(ctx, trust.SecretName, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, trust.Fingerprint(second.cert), s.Annotations[trust.CrossIssuerAnnotation])
		assert.Equal(t, root.pem, s.Data[trust.KeyRootCert], "root-cert.pem holds the one root")
		chain, err := pemutil.ParseCertificateBundle(s.Data[trust.KeyChain])
		require.NoError(t, err)
		require.Len(t, chain, 3, "the intermediate, the same from the second root, the issuing root")
		assert.Equal(t, root.cert.Subject.String(), chain[0].Issuer.String())
		assert.Equal(t, second.cert.Subject.String(), chain[1].Issuer.String())
		assert.True(t, chain[2].Equal(root.cert))
		results, _ = a.Apply(ctx, set, sign)
		assert.Equal(t, "unchanged", results[0].GetOutcome(), "the next pass changes nothing")

		// The step without a second signature replaces it.
		results, _ = a.Apply(ctx, &relaypb.OutputSet{Trust: []*relaypb.TrustRequest{request(ns, root)}},
			func(_ context.Context, r *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
				return answer(t, r.GetCsr(), nil), nil
			})
		require.Equal(t, "applied", results[0].GetOutcome(), results[0].GetError())
		s, err = c.CoreV1().Secrets(ns).Get(ctx, trust.SecretName, metav1.GetOptions{})
		require.NoError(t, err)
		assert.NotContains(t, s.Annotations, trust.CrossIssuerAnnotation)
		chain, err = pemutil.ParseCertificateBundle(s.Data[trust.KeyChain])
		require.NoError(t, err)
		assert.Len(t, chain, 2)
	})
	for _, tc := range []struct {
		name  string
		req   func(*relaypb.TrustRequest)
		cross func(t *testing.T, csr []byte) []byte
		want  string
	}{
		{"missing", nil, func(*testing.T, []byte) []byte { return nil }, "the answer carries none"},
		{"not asked for", func(r *relaypb.TrustRequest) { r.CrossIssuer, r.CrossRoot = "", nil },
			func(t *testing.T, csr []byte) []byte { return second.sign(t, csr, time.Hour, nil) }, "did not ask for"},
		{"another key", nil, func(t *testing.T, csr []byte) []byte {
			k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			return second.sign(t, csr, time.Hour, func(_ *x509.Certificate, p *crypto.PublicKey) { *p = k.Public() })
		}, "not for the key we generated"},
		{"another subject", nil, func(t *testing.T, csr []byte) []byte {
			return second.sign(t, csr, time.Hour, func(c *x509.Certificate, _ *crypto.PublicKey) { c.Subject.CommonName = "someone else" })
		}, "another subject"},
		{"a longer path", nil, func(t *testing.T, csr []byte) []byte {
			return second.sign(t, csr, time.Hour, func(c *x509.Certificate, _ *crypto.PublicKey) { c.MaxPathLen, c.MaxPathLenZero = 1, false })
		}, "path length 0"},
		{"from another root", nil, func(t *testing.T, csr []byte) []byte { return other.sign(t, csr, time.Hour, nil) }, "does not chain to the root the request names"},
		{"cross root not the one named", func(r *relaypb.TrustRequest) { r.CrossRoot = other.pem },
			func(t *testing.T, csr []byte) []byte { return other.sign(t, csr, time.Hour, nil) }, "not the root its cross issuer names"},
		{"cross root is the issuer", func(r *relaypb.TrustRequest) { r.CrossIssuer, r.CrossRoot = trust.Fingerprint(root.cert), root.pem },
			func(t *testing.T, csr []byte) []byte { return root.sign(t, csr, time.Hour, nil) }, "names its issuer as its cross issuer"},
		{"garbage", nil, func(*testing.T, []byte) []byte {
			return []byte("-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
		}, "not PEM certificates"},
		{"oversized", nil, func(*testing.T, []byte) []byte { return make([]byte, 300<<10) }, "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := namespace(t, c)
			req := crossReq(ns)
			if tc.req != nil {
				tc.req(req)
			}
			a := &trust.Agent{Client: c, Owner: "cross-" + ns[len(ns)-min(len(ns), 40):]}
			results, next := a.Apply(ctx, &relaypb.OutputSet{Trust: []*relaypb.TrustRequest{req}},
				func(_ context.Context, r *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
					return answer(t, r.GetCsr(), tc.cross(t, r.GetCsr())), nil
				})
			require.Len(t, results, 1)
			assert.Equal(t, "error", results[0].GetOutcome())
			assert.Contains(t, results[0].GetError(), tc.want)
			assert.False(t, next.IsZero(), "it tries again")
			_, err := c.CoreV1().Secrets(ns).Get(ctx, trust.SecretName, metav1.GetOptions{})
			assert.True(t, apierrors.IsNotFound(err), "nothing written")
		})
	}
}
