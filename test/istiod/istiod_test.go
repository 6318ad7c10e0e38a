package istiod

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/relaymesh/relaymesh/test/localcluster"
)

// testPKI is a root and an intermediate (pathLen 0) signed by it, the shape
// Relaymesh gives every mesh.
type testPKI struct {
	root, intermediate *x509.Certificate
	rootPEM, interPEM  []byte
	interKeyPEM        []byte
}

func newTestPKI(t *testing.T, name string) *testPKI {
	t.Helper()
	rootKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	rootTmpl := caTemplate(t, name+" root", 1)
	rootDER, err := x509.CreateCertificate(rand.Reader, rootTmpl, rootTmpl, &rootKey.PublicKey, rootKey)
	require.NoError(t, err)
	root, err := x509.ParseCertificate(rootDER)
	require.NoError(t, err)

	interKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	interTmpl := caTemplate(t, name+" intermediate", 0)
	interDER, err := x509.CreateCertificate(rand.Reader, interTmpl, root, &interKey.PublicKey, rootKey)
	require.NoError(t, err)
	inter, err := x509.ParseCertificate(interDER)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(interKey)
	require.NoError(t, err)
	return &testPKI{
		root:         root,
		intermediate: inter,
		rootPEM:      pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: rootDER}),
		interPEM:     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: interDER}),
		interKeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}
}

func caTemplate(t *testing.T, cn string, pathLen int) *x509.Certificate {
	t.Helper()
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	require.NoError(t, err)
	now := time.Now()
	return &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"relaymesh test"}, CommonName: cn},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(48 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            pathLen,
		MaxPathLenZero:        pathLen == 0,
	}
}

// cacerts are the four files of Istio's `cacerts` Secret.
func (p *testPKI) cacerts() map[string][]byte {
	return map[string][]byte{
		CACertFile:    p.interPEM,
		CAKeyFile:     p.interKeyPEM,
		CertChainFile: append(append([]byte{}, p.interPEM...), p.rootPEM...),
		RootCertFile:  p.rootPEM,
	}
}

func workloadCSR(t *testing.T, spiffeID string) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, csr, err := WorkloadCSR(spiffeID)
	require.NoError(t, err)
	return key, csr
}

func uris(c *x509.Certificate) []string {
	var out []string
	for _, u := range c.URIs {
		out = append(out, u.String())
	}
	return out
}

// verify checks the leaf against roots, with everything else istiod sent as
// intermediates.
func verify(chain []*x509.Certificate, roots ...*x509.Certificate) ([][]*x509.Certificate, error) {
	rootPool := x509.NewCertPool()
	for _, r := range roots {
		rootPool.AddCert(r)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	return chain[0].Verify(x509.VerifyOptions{
		Roots:         rootPool,
		Intermediates: inter,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	})
}

// A real istiod, with a plugged-in intermediate, signs workload
// certificates that chain to the test root, for the identity of the
// caller's token and nothing else.
func TestIstiodIssuesWorkloadCertificates(t *testing.T) {
	localcluster.SkipIfShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()

	cluster, cs := startCluster(ctx, t, dir,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: DefaultNamespace}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps"}},
	)

	const trustDomain = "mesh-1.relaymesh.test"
	pki := newTestPKI(t, "mesh-1")
	start := time.Now()
	d, err := Start(ctx, Config{
		Kubeconfig:  cluster.Kubeconfig,
		ClusterID:   "cluster-1",
		Dir:         filepath.Join(dir, "istiod"),
		CACerts:     pki.cacerts(),
		TrustDomain: trustDomain,
	})
	require.NoError(t, err)
	t.Logf("istiod ready in %s (pid %d, secure gRPC %s)", time.Since(start).Round(10*time.Millisecond), d.Pid(), d.Addresses().SecureGRPC)
	t.Cleanup(func() { assert.NoError(t, d.Stop()) })
	// On failure, show what istiod said.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("istiod log (last lines):\n%s", d.LogTail(60))
		}
	})

	sleepID := "spiffe://" + trustDomain + "/ns/apps/sa/sleep"
	sleepToken, err := ServiceAccountToken(ctx, cs, "apps", "sleep", TokenAudience)
	require.NoError(t, err)
	// istio-agent asks for the default trust domain; istiod decides.
	sleepKey, sleepCSR := workloadCSR(t, "spiffe://cluster.local/ns/apps/sa/sleep")

	var sleepChain []*x509.Certificate
	t.Run("sleep gets its certificate", func(t *testing.T) {
		chain, err := d.WorkloadCertificate(ctx, sleepToken, sleepCSR)
		require.NoError(t, err)
		sleepChain = chain
		leaf := chain[0]
		assert.Equal(t, []string{sleepID}, uris(leaf))
		assert.False(t, leaf.IsCA)
		pub, ok := leaf.PublicKey.(*ecdsa.PublicKey)
		require.True(t, ok, "leaf key is %T", leaf.PublicKey)
		assert.True(t, pub.Equal(&sleepKey.PublicKey), "leaf must carry the CSR's key")
		assert.True(t, chain[len(chain)-1].Equal(pki.root), "istiod sends its root last")

		chains, err := verify(chain, pki.root)
		require.NoError(t, err)
		require.Len(t, chains[0], 3, "leaf -> intermediate -> root")
		assert.True(t, chains[0][1].Equal(pki.intermediate), "signed by the plugged intermediate")
		assert.True(t, chains[0][2].Equal(pki.root))
	})

	t.Run("certificate does not verify against an unrelated root", func(t *testing.T) {
		require.NotEmpty(t, sleepChain)
		other := newTestPKI(t, "unrelated")
		_, err := verify(sleepChain, other.root)
		require.Error(t, err)
		var unknown x509.UnknownAuthorityError
		assert.ErrorAs(t, err, &unknown)
	})

	t.Run("secure port is not trusted through an unrelated root", func(t *testing.T) {
		other := newTestPKI(t, "unrelated")
		roots := x509.NewCertPool()
		roots.AddCert(other.root)
		dialer := &tls.Dialer{Config: &tls.Config{RootCAs: roots, ServerName: d.ServerName(), MinVersion: tls.VersionTLS12}}
		conn, err := dialer.DialContext(ctx, "tcp", d.Addresses().SecureGRPC)
		if err == nil {
			conn.Close()
		}
		var unknown x509.UnknownAuthorityError
		require.ErrorAs(t, err, &unknown)
	})

	t.Run("another service account cannot get sleep's identity", func(t *testing.T) {
		otherToken, err := ServiceAccountToken(ctx, cs, "apps", "httpbin", TokenAudience)
		require.NoError(t, err)

		// The CSR names sleep; istiod ignores that and certifies the caller.
		chain, err := d.WorkloadCertificate(ctx, otherToken, sleepCSR)
		require.NoError(t, err)
		assert.Equal(t, []string{"spiffe://" + trustDomain + "/ns/apps/sa/httpbin"}, uris(chain[0]))
		assert.NotContains(t, uris(chain[0]), sleepID)

		// Asking outright to impersonate sleep is refused.
		chain, err = d.CreateCertificate(ctx, CertificateRequest{
			Token:    otherToken,
			CSR:      sleepCSR,
			Metadata: map[string]string{ImpersonatedIdentityKey: sleepID},
		})
		require.Error(t, err, "impersonation granted: %v", chain)
		assert.Equal(t, codes.Unauthenticated, status.Code(err), "impersonation: %v", err)
		assert.Contains(t, err.Error(), "impersonation authentication failure")
	})

	t.Run("requests without a valid token are refused", func(t *testing.T) {
		wrongAudience, err := ServiceAccountToken(ctx, cs, "apps", "sleep", "https://kubernetes.default.svc.cluster-1")
		require.NoError(t, err)
		for name, token := range map[string]string{
			"no token":       "",
			"garbage":        "not-a-jwt",
			"wrong audience": wrongAudience,
			"tampered":       sleepToken[:len(sleepToken)-4] + flip(sleepToken[len(sleepToken)-4:]),
		} {
			_, err := d.WorkloadCertificate(ctx, token, sleepCSR)
			require.Error(t, err, name)
			assert.Equal(t, codes.Unauthenticated, status.Code(err), "%s: %v", name, err)
			assert.Contains(t, err.Error(), "request authenticate failure", name)
		}
	})

	t.Run("a CA key that does not match fails start with istiod's reason", func(t *testing.T) {
		bad := pki.cacerts()
		bad[CAKeyFile] = newTestPKI(t, "other").interKeyPEM
		_, err := Start(ctx, Config{
			Kubeconfig:   cluster.Kubeconfig,
			ClusterID:    "cluster-1",
			Dir:          filepath.Join(dir, "istiod-bad"),
			CACerts:      bad,
			ReadyTimeout: 30 * time.Second,
		})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "pilot-discovery exited")
		assert.Contains(t, err.Error(), "failed to create CA")
	})

	t.Run("stop leaves no process behind", func(t *testing.T) {
		pid := d.Pid()
		require.NoError(t, d.Stop())
		assert.False(t, localcluster.Alive(pid), "pilot-discovery pid %d still alive", pid)
		require.NoError(t, d.Stop(), "Stop twice")
	})
}

// flip changes every character of s, keeping it base64url.
func flip(s string) string {
	return strings.Map(func(r rune) rune {
		if r == 'A' {
			return 'B'
		}
		return 'A'
	}, s)
}

func TestConfigValidate(t *testing.T) {
	full := map[string][]byte{
		CACertFile: []byte("x"), CAKeyFile: []byte("x"), CertChainFile: []byte("x"),
		RootCertFile: newTestPKI(t, "v").rootPEM,
	}
	valid := Config{Kubeconfig: "k", ClusterID: "cluster-1", Dir: "d", CACerts: full}.Default()
	require.NoError(t, valid.Validate())

	tests := []struct {
		name   string
		modify func(*Config)
		want   []string
	}{
		{"empty", func(c *Config) { *c = Config{}.Default() }, []string{
			"kubeconfig: required", "dir: required", "clusterID: required",
			"caCerts[ca-cert.pem]: required", "caCerts[root-cert.pem]: required",
		}},
		{"bad names", func(c *Config) {
			c.ClusterID, c.Namespace, c.TrustDomain = "a b", "Istio_System", "Mesh/1"
		}, []string{"clusterID:", "namespace:", "trustDomain:"}},
		{"path in a cacerts key", func(c *Config) {
			c.CACerts = map[string][]byte{}
			for k, v := range full {
				c.CACerts[k] = v
			}
			c.CACerts["../ca-key.pem"] = []byte("x")
		}, []string{`caCerts["../ca-key.pem"]: must be a plain file name`}},
		{"root is not PEM", func(c *Config) {
			c.CACerts = map[string][]byte{CACertFile: []byte("x"), CAKeyFile: []byte("x"), CertChainFile: []byte("x"), RootCertFile: []byte("x")}
		}, []string{"caCerts[root-cert.pem]: no PEM certificate found"}},
		{"negative timeout", func(c *Config) { c.ReadyTimeout = -time.Second }, []string{"readyTimeout:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid
			tt.modify(&c)
			err := c.Validate()
			require.Error(t, err)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestAmbientIsOffUnlessAsked(t *testing.T) {
	cfg := Config{ClusterID: "cluster-1", Dir: "/tmp/x"}.Default()
	assert.NotContains(t, strings.Join(envArgs(cfg), " "), "PILOT_ENABLE_AMBIENT")
	cfg.Ambient = true
	env := envArgs(cfg)
	assert.Contains(t, env, "PILOT_ENABLE_AMBIENT=true")
	assert.Contains(t, env, "PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER=false")
}

// startCluster starts one local cluster, cluster-1, under dir (stopped when
// the test ends) and creates the namespaces in it.
func startCluster(ctx context.Context, t *testing.T, dir string, namespaces ...*corev1.Namespace) (*localcluster.Cluster, kubernetes.Interface) {
	t.Helper()
	env, err := localcluster.Start(ctx, localcluster.Config{Dir: filepath.Join(dir, "clusters"), Clusters: []string{"cluster-1"}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, env.Stop()) })
	cluster := env.Cluster("cluster-1")
	cs, err := cluster.Clientset()
	require.NoError(t, err)
	for _, ns := range namespaces {
		_, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	return cluster, cs
}
