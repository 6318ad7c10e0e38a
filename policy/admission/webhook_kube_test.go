package admission_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/policy/admission"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// servingCert makes a CA and a certificate for 127.0.0.1 signed by it.
func servingCert(t *testing.T) (tls.Certificate, []byte) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "webhook test CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	require.NoError(t, err)
	caCert, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, key.Public(), caKey)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
}

// The real kube-apiserver calls the webhook: a denied object is refused at
// apply time with the rule's message, an allowed one is created, the
// namespace's labels reach the rules, and every decision is audited with the
// user who asked.
func TestWebhookWithRealAPIServer(t *testing.T) {
	ctx := context.Background()
	cl, cs, _ := localcluster.Management(t, "")
	for name, labels := range map[string]map[string]string{"team-a": nil, "prod": {"relaymesh.io/environment": "production"}} {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}

	engine, rec := newEngine(t, nil)
	hook := &admission.Webhook{Engine: engine, NamespaceLabels: func(ctx context.Context, ns string) (map[string]string, error) {
		n, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return n.Labels, nil
	}}
	cert, caPEM := servingCert(t)
	// The webhook answers the apiserver's client certificate only (the
	// admission configuration of local clusters gives it one).
	clientCA, err := os.ReadFile(cl.WebhookClientCA)
	require.NoError(t, err)
	clientCAs := x509.NewCertPool()
	require.True(t, clientCAs.AppendCertsFromPEM(clientCA))
	srv := httptest.NewUnstartedServer(hook)
	srv.TLS = admission.ServerTLS(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &cert, nil }, clientCAs)
	srv.TLS.Certificates = []tls.Certificate{cert} // or httptest serves its own
	srv.StartTLS()
	t.Cleanup(srv.Close)
	require.NoError(t, admission.Register(ctx, cs, admission.Registration{URL: srv.URL + admission.WebhookPath, CABundle: caPEM}))
	vwc, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "relaymesh-admission", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, admissionregistrationv1.Fail, *vwc.Webhooks[0].FailurePolicy, "fail closed by default")

	allowAll := `
apiVersion: networking.relaymesh.io/v1alpha1
kind: AccessPolicy
metadata: {name: everyone, namespace: team-a%s}
spec: {}
`
	// The apiserver picks up a new webhook configuration within moments.
	var applyErr error
	require.Eventually(t, func() bool {
		_, applyErr = cl.Apply(ctx, "test", []byte(strings.ReplaceAll(allowAll, "%s", "")))
		return applyErr != nil
	}, 20*time.Second, 200*time.Millisecond, "the allow-all AccessPolicy is refused by the webhook")
	assert.Contains(t, applyErr.Error(), "lets every source reach every destination")
	assert.Contains(t, applyErr.Error(), "relaymesh.admission.access_allow_all")

	_, err = cl.Apply(ctx, "test", []byte(strings.ReplaceAll(allowAll, "%s", `, annotations: {relaymesh.io/allow-all: "true"}`)))
	require.NoError(t, err, "with the annotation it is allowed")

	fault := `
apiVersion: networking.relaymesh.io/v1alpha1
kind: TrafficPolicy
metadata: {name: chaos, namespace: %s}
spec:
  policy:
    faultInjection: {percentage: 10, abort: {httpStatus: 503}}
`
	_, err = cl.Apply(ctx, "test", []byte(strings.ReplaceAll(fault, "%s", "prod")))
	require.Error(t, err, "fault injection in a production namespace")
	assert.Contains(t, err.Error(), "production")
	_, err = cl.Apply(ctx, "test", []byte(strings.ReplaceAll(fault, "%s", "team-a")))
	require.NoError(t, err)

	events := rec.all()
	require.NotEmpty(t, events)
	var denied, allowed int
	for _, e := range events {
		assert.Equal(t, audit.AdmissionDecision, e.Type)
		assert.NotEmpty(t, e.Subject, "the user who asked")
		assert.Equal(t, "apiserver CN=kube-apiserver", e.Details["caller"], "the authenticated caller")
		if e.Result == audit.ResultFailure {
			denied++
		} else {
			allowed++
		}
	}
	assert.GreaterOrEqual(t, denied, 2)
	assert.GreaterOrEqual(t, allowed, 2)

	// Anyone else cannot even complete the handshake, whatever they post.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	forger := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	_, err = forger.Post(srv.URL+admission.WebhookPath, "application/json", strings.NewReader(`{"request":{"userInfo":{"username":"forged"}}}`))
	require.Error(t, err, "no client certificate, no webhook")
	for _, e := range rec.all() {
		assert.NotEqual(t, "forged", e.Subject)
	}

	// With the webhook unreachable and failurePolicy Fail, nothing passes.
	srv.Close()
	_, err = cl.Apply(ctx, "test", []byte(`
apiVersion: networking.relaymesh.io/v1alpha1
kind: AccessPolicy
metadata: {name: while-down, namespace: team-a}
spec: {destinationSelector: [{kubeServiceMatcher: {namespaces: [team-a]}}]}
`))
	require.Error(t, err, "failurePolicy Fail: an unreachable webhook blocks changes")
}

// Bad requests to the handler are refused without a decision.
func TestWebhookRefusesBadRequests(t *testing.T) {
	engine, rec := newEngine(t, nil)
	hook := &admission.Webhook{Engine: engine}
	for _, tc := range []struct {
		name, method string
		body         []byte
		code         int
	}{
		{"GET", http.MethodGet, nil, http.StatusMethodNotAllowed},
		{"not JSON", http.MethodPost, []byte("{"), http.StatusBadRequest},
		{"no request", http.MethodPost, []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`), http.StatusBadRequest},
		{"oversized", http.MethodPost, bytes.Repeat([]byte(" "), 8<<20), http.StatusRequestEntityTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			hook.ServeHTTP(w, fromAPIServer(httptest.NewRequest(tc.method, admission.WebhookPath, bytes.NewReader(tc.body))))
			assert.Equal(t, tc.code, w.Code)
		})
	}
	assert.Empty(t, rec.all(), "nothing was decided")

	// Past the limit, requests are refused before anything is decided or
	// audited.
	limited := &admission.Webhook{Engine: engine, Limiter: rate.NewLimiter(0, 1)}
	codes := []int{}
	for range 3 {
		w := httptest.NewRecorder()
		limited.ServeHTTP(w, fromAPIServer(httptest.NewRequest(http.MethodPost, admission.WebhookPath, bytes.NewReader([]byte("{")))))
		codes = append(codes, w.Code)
	}
	assert.Equal(t, []int{http.StatusBadRequest, http.StatusTooManyRequests, http.StatusTooManyRequests}, codes)

	// An object that is not a JSON object is denied (fail closed), with the UID echoed.
	review := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "u-1", Kind: metav1.GroupVersionKind{Kind: "AccessPolicy"}, Operation: admissionv1.Create,
			Namespace: "team-a", Name: "x", Object: runtime.RawExtension{Raw: []byte(`"a string, not an object"`)}}}
	body, err := json.Marshal(review)
	require.NoError(t, err)
	w := httptest.NewRecorder()
	hook.ServeHTTP(w, fromAPIServer(httptest.NewRequest(http.MethodPost, admission.WebhookPath, bytes.NewReader(body))))
	require.Equal(t, http.StatusOK, w.Code)
	var out admissionv1.AdmissionReview
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &out))
	require.NotNil(t, out.Response)
	assert.Equal(t, "u-1", string(out.Response.UID))
	assert.False(t, out.Response.Allowed)
}

// Callers without a verified client certificate are refused unread, unless
// the webhook is told to accept them (the weaker mode); then each address
// has its own budget, apart from the authenticated callers', and their
// decisions name them as unauthenticated.
func TestWebhookUnauthenticatedCallers(t *testing.T) {
	engine, rec := newEngine(t, nil)
	review := func(user string) []byte {
		b, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
			Request: &admissionv1.AdmissionRequest{UID: "u", Kind: metav1.GroupVersionKind{Kind: "AccessPolicy"}, Operation: admissionv1.Create,
				Namespace: "team-a", Name: "x", UserInfo: authenticationv1.UserInfo{Username: user},
				Object: runtime.RawExtension{Raw: []byte(`{"metadata":{"name":"x"},"spec":{"destinationSelector":[{"kubeServiceMatcher":{"namespaces":["team-a"]}}]}}`)}}})
		require.NoError(t, err)
		return b
	}
	post := func(h *admission.Webhook, r *http.Request) int {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	strict := &admission.Webhook{Engine: engine, Limiter: rate.NewLimiter(0, 2)}
	assert.Equal(t, http.StatusUnauthorized, post(strict, httptest.NewRequest(http.MethodPost, admission.WebhookPath, bytes.NewReader(review("forged")))))
	assert.Empty(t, rec.all(), "nothing judged, nothing audited")

	weak := &admission.Webhook{Engine: engine, Limiter: rate.NewLimiter(0, 2), AllowUnauthenticated: true, UnauthenticatedLimit: 0.001, UnauthenticatedBurst: 3}
	from := func(addr, user string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, admission.WebhookPath, bytes.NewReader(review(user)))
		r.RemoteAddr = addr
		return r
	}
	var codes []int
	for range 5 {
		codes = append(codes, post(weak, from("203.0.113.9:4000", "forged-admin")))
	}
	assert.Equal(t, []int{200, 200, 200, 429, 429}, codes, "an unauthenticated address has a budget of its own")
	assert.Equal(t, http.StatusOK, post(weak, from("198.51.100.1:4000", "someone")), "another address is not blocked by it")
	assert.Equal(t, http.StatusOK, post(weak, fromAPIServer(from("192.0.2.1:6443", "alice"))), "nor is the apiserver")
	assert.Equal(t, http.StatusOK, post(weak, fromAPIServer(from("192.0.2.1:6443", "alice"))))
	var unauth, apiserver int
	for _, e := range rec.all() {
		switch {
		case strings.HasPrefix(e.Details["caller"], "unauthenticated "):
			unauth++
		case e.Details["caller"] == "apiserver CN=kube-apiserver":
			apiserver++
		}
	}
	assert.Equal(t, 4, unauth, "the unauthenticated decisions say so")
	assert.Equal(t, 2, apiserver)
}
