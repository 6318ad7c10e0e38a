package opsclient

import (
	"context"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/relaymesh/relaymesh/ca/catest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
)

func TestGet(t *testing.T) {
	var auth []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth = append(auth, r.URL.Path+"="+r.Header.Get("Authorization"))
		switch r.URL.Path {
		case "/metrics":
			_, _ = w.Write([]byte("# TYPE relaymesh_build_info gauge\nrelaymesh_build_info{go_version=\"go1\",version=\"v1.2.3\"} 1\nrelaymesh_relay_connected_agents 2\n"))
		case "/debug/admission":
			if r.Header.Get("Authorization") != "Bearer t0ken-value" {
				http.Error(w, "a bearer token is required", http.StatusUnauthorized)
				return
			}
			_, _ = w.Write([]byte(`{"ok":true}`))
		case "/big":
			_, _ = w.Write([]byte(strings.Repeat("x", 64<<10+1)))
		}
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	ctx := context.Background()

	c := &Client{Address: addr, Token: "t0ken-value"}
	body, err := c.Get(ctx, "/metrics")
	require.NoError(t, err)
	m, err := ParseMetrics(body)
	require.NoError(t, err)
	v, err := Version(m)
	require.NoError(t, err)
	assert.Equal(t, "v1.2.3", v)
	n, ok := m.Value("relaymesh_relay_connected_agents", nil)
	assert.True(t, ok)
	assert.Equal(t, 2.0, n)
	_, ok = m.Value("relaymesh_build_info", map[string]string{"version": "v9"})
	assert.False(t, ok)

	body, err = c.Get(ctx, "/debug/admission")
	require.NoError(t, err)
	assert.JSONEq(t, `{"ok":true}`, string(body))
	assert.Equal(t, []string{"/metrics=", "/debug/admission=Bearer t0ken-value"}, auth, "the token goes to /debug only")

	_, err = (&Client{Address: addr}).Get(ctx, "/debug/admission")
	assert.ErrorContains(t, err, "401")
	_, err = (&Client{Address: addr, maxBody: 64 << 10}).Get(ctx, "/big")
	assert.ErrorContains(t, err, "larger than 65536 bytes")
	big, err := c.Get(ctx, "/big")
	require.NoError(t, err, "the default bound (MaxBody) is larger")
	assert.Len(t, big, 64<<10+1)
	_, err = c.Get(ctx, "metrics")
	assert.Error(t, err)

	// No token goes over plain HTTP to another machine (192.0.2.1 is
	// TEST-NET-1: the refusal comes before any dial).
	auth = nil
	far := &Client{Address: "192.0.2.1:9091", Token: "t0ken-value"}
	_, err = far.Get(ctx, "/debug/admission")
	assert.ErrorIs(t, err, ErrCleartextToken)
	assert.NotContains(t, err.Error(), "t0ken-value")
	assert.Contains(t, err.Error(), "TLS")
	assert.Empty(t, auth)
	// The service proxy cannot carry a token: /debug needs an address.
	_, err = (&Client{Service: "relaymesh-server", Namespace: "relaymesh"}).Get(ctx, "/debug/admission")
	assert.ErrorIs(t, err, ErrNoAddress)
	_, err = (&Client{}).Get(ctx, "/metrics")
	assert.ErrorIs(t, err, ErrNoAddress)
}

func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{"127.0.0.1:9091": true, "[::1]:9091": true, "localhost:9091": true, "10.0.0.1:9091": false, "relaymesh-server:9091": false, "bad": false} {
		assert.Equal(t, want, loopback(addr), addr)
	}
}

func TestParseMetricsRefusesGarbage(t *testing.T) {
	_, err := ParseMetrics([]byte("relaymesh_build_info{version=\"unterminated} 1\n"))
	assert.Error(t, err)
	_, err = Version(Metrics{})
	assert.ErrorContains(t, err, "no relaymesh_build_info")
}

// FuzzParseMetrics: whatever a server sends, parsing and reading it never
// panics.
func FuzzParseMetrics(f *testing.F) {
	f.Add([]byte("relaymesh_build_info{version=\"v1\"} 1\n"))
	f.Add([]byte("# TYPE x counter\nx 1\n"))
	f.Fuzz(func(_ *testing.T, b []byte) {
		m, err := ParseMetrics(b)
		if err != nil {
			return
		}
		_, _ = Version(m)
		_, _ = m.Value(BuildInfoMetric, map[string]string{"version": "v1"})
	})
}

// The apiserver's service proxy says "not found" both for a Service that
// does not exist and for one no ready pod backs: the client tells them
// apart, and names the way to give an address directly.
func TestServiceProxyNotFoundIsExplained(t *testing.T) {
	ctx := context.Background()
	notFound := apierrors.NewNotFound(schema.GroupResource{Resource: "services"}, "relaymesh-server:metrics")
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "relaymesh-server", Namespace: "relaymesh"}}
	meta := metav1.ObjectMeta{Name: "relaymesh-server", Namespace: "relaymesh"}
	//lint:ignore SA1019 the service proxy reads Endpoints
	ready := &corev1.Endpoints{ObjectMeta: meta, Subsets: []corev1.EndpointSubset{{Addresses: []corev1.EndpointAddress{{IP: "10.0.0.1"}}}}}
	//lint:ignore SA1019 as above
	empty := &corev1.Endpoints{ObjectMeta: meta, Subsets: []corev1.EndpointSubset{{NotReadyAddresses: []corev1.EndpointAddress{{IP: "10.0.0.1"}}}}}
	for _, tt := range []struct {
		name    string
		objects []runtime.Object
		err     error
		want    error
		says    string
	}{
		{"no Service", nil, notFound, ErrNoService, "no Service relaymesh/relaymesh-server (is the server installed in namespace relaymesh"},
		{"no Endpoints object", []runtime.Object{svc}, notFound, ErrNoEndpoints, "exists, but no ready pod backs it"},
		{"only not-ready addresses", []runtime.Object{svc, empty}, apierrors.NewServiceUnavailable("no endpoints available"), ErrNoEndpoints, "by hand or in the demo"},
		{"ready: the apiserver's word stands", []runtime.Object{svc, ready}, notFound, nil, ""},
		{"another error", nil, apierrors.NewForbidden(schema.GroupResource{Resource: "services"}, "x", nil), nil, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := &Client{Kube: fake.NewClientset(tt.objects...), Namespace: "relaymesh", Service: "relaymesh-server", Port: "metrics", DirectHint: "pass --server-metrics-address HOST:PORT"}
			got := c.whyUnproxied(ctx, tt.err)
			if tt.want == nil {
				assert.NoError(t, got)
				return
			}
			require.Error(t, got)
			assert.ErrorIs(t, got, tt.want)
			assert.Contains(t, got.Error(), tt.says)
			assert.True(t, strings.HasSuffix(got.Error(), "; pass --server-metrics-address HOST:PORT"), got.Error())
			assert.NotContains(t, got.Error(), "not found")
		})
	}
}

// The decision: a token goes over HTTPS anywhere, over plain HTTP to
// loopback only; a name that is not an IP literal is not loopback (except
// localhost), whatever it resolves to.
func TestSendTokenOnlyOverTLSOrToLoopback(t *testing.T) {
	for _, tt := range []struct {
		scheme, addr string
		ok           bool
	}{
		{"https", "192.0.2.1:9091", true},
		{"https", "relaymesh-server.relaymesh.svc:9091", true},
		{"http", "127.0.0.1:9091", true},
		{"http", "127.3.4.5:9091", true},
		{"http", "[::1]:9091", true},
		{"http", "localhost:9091", true},
		{"http", "192.0.2.1:9091", false},
		{"http", "[2001:db8::1]:9091", false},
		{"http", "relaymesh-server:9091", false},
		{"http", "localhost.example.com:9091", false},
		{"http", "127.0.0.1", false}, // no port: not parsed, refused
		{"http", "", false},
		{"HTTP", "192.0.2.1:9091", false},
		{"", "192.0.2.1:9091", false},
	} {
		err := SendToken(tt.scheme, tt.addr)
		if tt.ok {
			assert.NoError(t, err, "%s://%s", tt.scheme, tt.addr)
		} else {
			assert.ErrorIs(t, err, ErrCleartextToken, "%s://%s", tt.scheme, tt.addr)
		}
	}
}

// Over TLS the server is verified against RootCAs: the right CA reads
// /metrics and /debug (with the token), a wrong CA reads nothing and
// sends no token, and a CA that cannot be loaded says so.
func TestGetOverTLSVerifiesTheServer(t *testing.T) {
	var auth []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth = append(auth, r.URL.Path+"="+r.Header.Get("Authorization"))
		switch r.URL.Path {
		case "/metrics":
			_, _ = w.Write([]byte("relaymesh_build_info{version=\"v1\"} 1\n"))
		case "/debug/admission":
			_, _ = w.Write([]byte(`{}`))
		case "/debug/redirect":
			http.Redirect(w, r, "http://192.0.2.1:9091/debug/admission", http.StatusFound)
		}
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "https://")
	ctx := context.Background()
	right := func(context.Context) (*x509.CertPool, error) {
		pool := x509.NewCertPool()
		pool.AddCert(srv.Certificate())
		return pool, nil
	}
	c := &Client{Address: addr, Token: "t0ken-value", RootCAs: right}
	assert.Equal(t, "https://"+addr, c.Where())
	body, err := c.Get(ctx, "/metrics")
	require.NoError(t, err)
	assert.Contains(t, string(body), "relaymesh_build_info")
	_, err = c.Get(ctx, "/debug/admission")
	require.NoError(t, err)
	assert.Equal(t, []string{"/metrics=", "/debug/admission=Bearer t0ken-value"}, auth)

	// A redirect is not followed: it could carry the token elsewhere.
	auth = nil
	_, err = c.Get(ctx, "/debug/redirect")
	assert.ErrorContains(t, err, "302")
	assert.Len(t, auth, 1)

	// (httptest's TLS servers all share one certificate: the wrong CA is
	// one of its own.)
	otherCA := catest.NewRoot(t, catest.CAOptions{})
	wrong := func(context.Context) (*x509.CertPool, error) {
		pool := x509.NewCertPool()
		pool.AddCert(otherCA.Cert)
		return pool, nil
	}
	auth = nil
	for name, roots := range map[string]func(context.Context) (*x509.CertPool, error){
		"wrong CA":   wrong,
		"system CAs": func(context.Context) (*x509.CertPool, error) { return x509.NewCertPool(), nil },
	} {
		_, err = (&Client{Address: addr, Token: "t0ken-value", RootCAs: roots}).Get(ctx, "/debug/admission")
		var unknown x509.UnknownAuthorityError
		require.True(t, errors.As(err, &unknown), "%s: %v", name, err)
		assert.NotContains(t, err.Error(), "t0ken-value")
	}
	assert.Empty(t, auth, "a server that is not verified hears no request at all")

	_, err = (&Client{Address: addr, RootCAs: func(context.Context) (*x509.CertPool, error) { return nil, errors.New("no secret") }}).Get(ctx, "/metrics")
	assert.ErrorContains(t, err, "the CA to verify the metrics port with: no secret")

	// A plain-HTTP client does not speak to a TLS port.
	_, err = (&Client{Address: addr}).Get(ctx, "/metrics")
	assert.Error(t, err)
}

// Through the service proxy a TLS port is named https:SERVICE:PORT, so
// the apiserver dials it with TLS.
func TestServiceProxyNamesTheTLSPort(t *testing.T) {
	c := &Client{Namespace: "relaymesh", Service: "relaymesh-server", Port: "metrics"}
	assert.Equal(t, "service proxy relaymesh/relaymesh-server:metrics", c.Where())
	c.RootCAs = func(context.Context) (*x509.CertPool, error) { return x509.NewCertPool(), nil }
	assert.Equal(t, "service proxy relaymesh/https:relaymesh-server:metrics", c.Where())
}
