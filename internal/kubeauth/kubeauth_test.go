package kubeauth_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/internal/kubeauth"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
)

func debugAttrs(r *http.Request) *authorizationv1.ResourceAttributes {
	return &authorizationv1.ResourceAttributes{Namespace: "relaymesh", Verb: "get", Group: "relaymesh.io", Resource: "debug", Name: strings.TrimPrefix(r.URL.Path, "/")}
}

// Against a real apiserver: no token, a garbage or oversized token, a
// token whose user lacks the RBAC rule, and an unreachable apiserver are
// all refused; a token whose service account is granted `get` on
// relaymesh.io/debug passes, for the names it is granted only.
func TestHandlerWithRealAPIServer(t *testing.T) {
	ctx := context.Background()
	mgmt, _, _ := localcluster.Management(t, "")
	cfg := mgmt.RESTConfig()
	var calls atomic.Int32
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			if strings.Contains(r.URL.Path, "tokenreviews") || strings.Contains(r.URL.Path, "subjectaccessreviews") {
				calls.Add(1)
			}
			return rt.RoundTrip(r)
		})
	}
	kube, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	_, err = kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "relaymesh"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	token := func(sa string) string {
		_, err := kube.CoreV1().ServiceAccounts("relaymesh").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
		require.NoError(t, err)
		tr, err := kube.CoreV1().ServiceAccounts("relaymesh").CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		require.NoError(t, err)
		return tr.Status.Token
	}
	reader, other := token("reader"), token("other")
	_, err = kube.RbacV1().Roles("relaymesh").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "debug-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"relaymesh.io"}, Resources: []string{"debug"}, Verbs: []string{"get"}, ResourceNames: []string{"snapshots-input"}}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = kube.RbacV1().RoleBindings("relaymesh").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "debug-reader"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "debug-reader"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "reader", Namespace: "relaymesh"}}}, metav1.CreateOptions{})
	require.NoError(t, err)

	a, err := kubeauth.New(kubeauth.Config{Client: kube, CacheTTL: time.Minute})
	require.NoError(t, err)
	var served atomic.Int32
	srv := httptest.NewServer(a.Handler(debugAttrs, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		u, ok := kubeauth.User(r.Context())
		require.True(t, ok)
		_, _ = io.WriteString(w, "hello "+u.Username)
	})))
	defer srv.Close()
	get := func(path, auth string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		require.NoError(t, err)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	for _, tc := range []struct {
		name, path, auth string
		want             int
	}{
		{"no token", "/snapshots-input", "", http.StatusUnauthorized},
		{"basic auth", "/snapshots-input", "Basic cmVhZGVyOnNlY3JldA==", http.StatusUnauthorized},
		{"garbage token", "/snapshots-input", "Bearer not-a-token", http.StatusUnauthorized},
		{"oversized token", "/snapshots-input", "Bearer " + strings.Repeat("a", kubeauth.MaxTokenBytes+1), http.StatusUnauthorized},
		{"a user without the rule", "/snapshots-input", "Bearer " + other, http.StatusForbidden},
		{"the reader, another name", "/snapshots-output", "Bearer " + reader, http.StatusForbidden},
		{"the reader", "/snapshots-input", "Bearer " + reader, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := served.Load()
			code, body := get(tc.path, tc.auth)
			assert.Equal(t, tc.want, code, body)
			if tc.want != http.StatusOK {
				assert.Equal(t, before, served.Load(), "a refused request never reaches the handler")
				assert.NotContains(t, body, reader)
				assert.NotContains(t, body, other)
			} else {
				assert.Equal(t, "hello system:serviceaccount:relaymesh:reader", body)
			}
		})
	}

	// Answers are cached: the same request again asks the apiserver nothing.
	n := calls.Load()
	code, _ := get("/snapshots-input", "Bearer "+reader)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, n, calls.Load(), "the token review and the access review are cached")

	// With an audience, only tokens minted for it are accepted: not the
	// apiserver's own (a plain `kubectl create token`), not istio-ca's.
	minted := func(sa string, audiences ...string) string {
		tr, err := kube.CoreV1().ServiceAccounts("relaymesh").CreateToken(ctx, sa, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: audiences}}, metav1.CreateOptions{})
		require.NoError(t, err)
		return tr.Status.Token
	}
	dash, err := kubeauth.New(kubeauth.Config{Client: kube, Audiences: []string{"relaymesh-dashboard"}})
	require.NoError(t, err)
	for _, tc := range []struct {
		name  string
		token string
		ok    bool
	}{
		{"the dashboard's audience", minted("reader", "relaymesh-dashboard"), true},
		{"the dashboard's among others", minted("reader", "istio-ca", "relaymesh-dashboard"), true},
		{"istio-ca's", minted("reader", "istio-ca"), false},
		{"the apiserver's own", reader, false},
	} {
		u, err := dash.Authenticate(ctx, tc.token)
		if tc.ok {
			require.NoError(t, err, tc.name)
			assert.Equal(t, "system:serviceaccount:relaymesh:reader", u.Username, tc.name)
		} else {
			assert.ErrorIs(t, err, kubeauth.ErrUnauthenticated, tc.name)
		}
	}

	// An apiserver that cannot be asked refuses (fail closed).
	down, err := kubernetes.NewForConfig(&rest.Config{Host: "https://127.0.0.1:1", Timeout: time.Second})
	require.NoError(t, err)
	a2, err := kubeauth.New(kubeauth.Config{Client: down})
	require.NoError(t, err)
	srv2 := httptest.NewServer(a2.Handler(debugAttrs, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("served without a review")
	})))
	defer srv2.Close()
	req, err := http.NewRequest(http.MethodGet, srv2.URL+"/snapshots-input", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+reader)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
}

// A review that authenticates the token but names none of the audiences
// asked for (an authenticator that is not audience-aware) is a refusal,
// and so is one naming another audience.
func TestAuthenticateRefusesAnAnswerWithoutTheAudience(t *testing.T) {
	for _, answered := range [][]string{nil, {"istio-ca"}, {"relaymesh-dashboard-x"}} {
		kube := fake.NewClientset()
		kube.PrependReactor("create", "tokenreviews", func(action k8stesting.Action) (bool, runtime.Object, error) {
			tr := action.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview)
			assert.Equal(t, []string{"relaymesh-dashboard"}, tr.Spec.Audiences, "the review asks for the audience")
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: answered, User: authenticationv1.UserInfo{Username: "someone"}}
			return true, tr, nil
		})
		a, err := kubeauth.New(kubeauth.Config{Client: kube, Audiences: []string{"relaymesh-dashboard"}})
		require.NoError(t, err)
		_, err = a.Authenticate(context.Background(), "token")
		assert.ErrorIs(t, err, kubeauth.ErrUnauthenticated, "answered %v", answered)
	}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// FuzzToken: whatever the header, Token returns a token without white space
// or refuses, and never panics.
func FuzzToken(f *testing.F) {
	f.Add("Bearer abc")
	f.Add("bearer  abc ")
	f.Add("Basic abc")
	f.Add("Bearer a b")
	f.Fuzz(func(t *testing.T, h string) {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header["Authorization"] = []string{h}
		tok, err := kubeauth.Token(r)
		if err != nil {
			return
		}
		require.NotEmpty(t, tok)
		require.LessOrEqual(t, len(tok), kubeauth.MaxTokenBytes)
		require.False(t, strings.ContainsAny(tok, " \t\r\n"))
	})
}
