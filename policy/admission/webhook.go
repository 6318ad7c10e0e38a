package admission

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"golang.org/x/time/rate"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// maxReviewBytes bounds one AdmissionReview body (the apiserver's own limit
// on an object is 3 MiB; the review carries it and its old version).
const maxReviewBytes = 7 << 20

// WebhookPath is where the handler is served.
const WebhookPath = "/validate"

// Webhook serves the apiserver's ValidatingAdmissionWebhook calls
// (admission.k8s.io/v1 AdmissionReview) with an Engine. A request that
// cannot be judged is denied.
type Webhook struct {
	Engine *Engine
	// NamespaceLabels returns the labels of a namespace; an error denies
	// (the rules may depend on them).
	NamespaceLabels func(ctx context.Context, namespace string) (map[string]string, error)
	// Limiter bounds the requests of authenticated callers judged (and
	// audited) per second; more are answered 429, which the apiserver
	// treats as a failed call (denied under failurePolicy Fail). Nil: no
	// limit.
	Limiter *rate.Limiter
	// AllowUnauthenticated (WEAKER) judges callers without a verified
	// client certificate too. Their decisions are audited with the caller
	// "unauthenticated <address>" (the user they name is a claim), and they
	// spend budgets of their own (UnauthenticatedLimit per address and in
	// total), never the authenticated callers'. Without it a request
	// without a verified client certificate is refused (401) unread; the
	// TLS server normally refuses it before that.
	AllowUnauthenticated bool
	// UnauthenticatedLimit and UnauthenticatedBurst bound unauthenticated
	// requests per address and, times ten, in total; defaults 5/s, 20.
	UnauthenticatedLimit rate.Limit
	UnauthenticatedBurst int
	Logger               *slog.Logger

	once    sync.Once
	anyone  *rate.Limiter
	byAddr  map[string]*rate.Limiter
	addrsMu sync.Mutex
}

// maxTrackedAddresses bounds the per-address budgets of unauthenticated
// callers; past it, they share the total budget only.
const maxTrackedAddresses = 4096

// caller says who delivered r and whether it may be judged now.
func (w *Webhook) caller(r *http.Request) (caller string, status int) {
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
		if w.Limiter != nil && !w.Limiter.Allow() {
			return "", http.StatusTooManyRequests
		}
		return "apiserver CN=" + r.TLS.VerifiedChains[0][0].Subject.CommonName, 0
	}
	if !w.AllowUnauthenticated {
		return "", http.StatusUnauthorized
	}
	w.once.Do(func() {
		if w.UnauthenticatedLimit == 0 {
			w.UnauthenticatedLimit = 5
		}
		if w.UnauthenticatedBurst == 0 {
			w.UnauthenticatedBurst = 20
		}
		w.anyone = rate.NewLimiter(10*w.UnauthenticatedLimit, 10*w.UnauthenticatedBurst)
		w.byAddr = map[string]*rate.Limiter{}
	})
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	w.addrsMu.Lock()
	l := w.byAddr[host]
	if l == nil && len(w.byAddr) < maxTrackedAddresses {
		l = rate.NewLimiter(w.UnauthenticatedLimit, w.UnauthenticatedBurst)
		w.byAddr[host] = l
	}
	w.addrsMu.Unlock()
	if (l != nil && !l.Allow()) || !w.anyone.Allow() {
		return "", http.StatusTooManyRequests
	}
	return "unauthenticated " + host, 0
}

func (w *Webhook) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(rw, "POST an AdmissionReview", http.StatusMethodNotAllowed)
		return
	}
	caller, code := w.caller(r)
	switch code {
	case http.StatusUnauthorized:
		http.Error(rw, "the webhook answers the kube-apiserver only: present its client certificate", http.StatusUnauthorized)
		return
	case http.StatusTooManyRequests:
		http.Error(rw, "too many admission requests; retry", http.StatusTooManyRequests)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxReviewBytes+1))
	if err != nil || len(body) > maxReviewBytes {
		http.Error(rw, fmt.Sprintf("the AdmissionReview is unreadable or larger than %d bytes", maxReviewBytes), http.StatusRequestEntityTooLarge)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		http.Error(rw, "the body is not an admission.k8s.io/v1 AdmissionReview with a request", http.StatusBadRequest)
		return
	}
	resp := w.review(r.Context(), review.Request, caller)
	out := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Response: resp}
	rw.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(rw).Encode(out); err != nil && w.Logger != nil {
		w.Logger.Warn("admission response not sent", "error", err)
	}
}

// review judges one request; every way it can fail is a denial.
func (w *Webhook) review(ctx context.Context, req *admissionv1.AdmissionRequest, caller string) *admissionv1.AdmissionResponse {
	deny := func(code int32, reason metav1.StatusReason, msg string) *admissionv1.AdmissionResponse {
		return &admissionv1.AdmissionResponse{UID: req.UID, Allowed: false,
			Result: &metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: reason, Message: msg}}
	}
	in := Request{Operation: string(req.Operation), Kind: req.Kind.Kind, Namespace: req.Namespace, Name: req.Name,
		User: User{Username: req.UserInfo.Username, Groups: req.UserInfo.Groups}, Caller: caller}
	for _, part := range []struct {
		raw []byte
		dst *map[string]any
	}{{req.Object.Raw, &in.Object}, {req.OldObject.Raw, &in.OldObject}} {
		if len(part.raw) == 0 {
			continue
		}
		if err := json.Unmarshal(part.raw, part.dst); err != nil {
			return deny(http.StatusBadRequest, metav1.StatusReasonBadRequest, "relaymesh admission: the object is not JSON")
		}
	}
	if in.Name == "" && in.Object != nil {
		// Generated names are not known yet at CREATE.
		if md, ok := in.Object["metadata"].(map[string]any); ok {
			in.Name, _ = md["generateName"].(string)
		}
	}
	if in.Namespace != "" && w.NamespaceLabels != nil {
		labels, err := w.NamespaceLabels(ctx, in.Namespace)
		if err != nil {
			return deny(http.StatusInternalServerError, metav1.StatusReasonInternalError,
				"relaymesh admission: the labels of namespace "+in.Namespace+" are unavailable, so the check could not run: "+err.Error())
		}
		in.NamespaceLabels = labels
	}
	d, err := w.Engine.Decide(ctx, in)
	switch {
	case err != nil:
		return deny(http.StatusInternalServerError, metav1.StatusReasonInternalError, "relaymesh admission check failed, so the object is refused: "+err.Error())
	case !d.Allowed:
		return deny(http.StatusForbidden, metav1.StatusReasonForbidden, "relaymesh admission: "+d.Message())
	}
	return &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
}

// Registration describes the ValidatingWebhookConfiguration the server
// keeps.
type Registration struct {
	// Name of the ValidatingWebhookConfiguration; default
	// "relaymesh-admission".
	Name string
	// URL of the webhook (https), or Service (namespace/name and port) —
	// exactly one.
	URL              string
	ServiceNamespace string
	ServiceName      string
	ServicePort      int32
	// CABundle verifies the webhook's serving certificate (PEM).
	CABundle []byte
	// FailurePolicy: Fail (default; an unreachable webhook blocks changes)
	// or Ignore (the named, weaker opt-in: objects pass while it is down,
	// and the in-process check marks them Invalid).
	FailurePolicy admissionregistrationv1.FailurePolicyType
	// Timeout of one call; default 5s (1–30s).
	Timeout time.Duration
}

// Register creates or updates the ValidatingWebhookConfiguration that sends
// every create and update of VirtualMeshes, TrafficPolicies, AccessPolicies
// and VirtualDestinations to the webhook.
func Register(ctx context.Context, client kubernetes.Interface, r Registration) error {
	if r.Name == "" {
		r.Name = "relaymesh-admission"
	}
	if r.FailurePolicy == "" {
		r.FailurePolicy = admissionregistrationv1.Fail
	}
	if r.FailurePolicy != admissionregistrationv1.Fail && r.FailurePolicy != admissionregistrationv1.Ignore {
		return fmt.Errorf("admission webhook: failure policy %q is not Fail or Ignore", r.FailurePolicy)
	}
	if r.Timeout == 0 {
		r.Timeout = 5 * time.Second
	}
	if r.Timeout < time.Second || r.Timeout > 30*time.Second {
		return fmt.Errorf("admission webhook: timeout %v is outside 1s–30s", r.Timeout)
	}
	if len(r.CABundle) == 0 {
		return errors.New("admission webhook: a CA bundle is required")
	}
	cc := admissionregistrationv1.WebhookClientConfig{CABundle: r.CABundle}
	switch {
	case r.URL != "" && r.ServiceName == "":
		cc.URL = &r.URL
	case r.URL == "" && r.ServiceName != "" && r.ServiceNamespace != "":
		path := WebhookPath
		port := r.ServicePort
		if port == 0 {
			port = 443
		}
		cc.Service = &admissionregistrationv1.ServiceReference{Namespace: r.ServiceNamespace, Name: r.ServiceName, Path: &path, Port: &port}
	default:
		return errors.New("admission webhook: set exactly one of a URL or a Service")
	}
	seconds := int32(r.Timeout / time.Second)
	none := admissionregistrationv1.SideEffectClassNone
	equivalent := admissionregistrationv1.Equivalent
	scope := admissionregistrationv1.NamespacedScope
	want := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: r.Name, Labels: map[string]string{"app.kubernetes.io/managed-by": "relaymesh"}},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         "validate.relaymesh.io",
			ClientConfig: cc,
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{networkingv1alpha1.GroupVersion.Group}, APIVersions: []string{networkingv1alpha1.GroupVersion.Version},
					Resources: networkingv1alpha1.Resources(), Scope: &scope},
			}},
			FailurePolicy:           &r.FailurePolicy,
			MatchPolicy:             &equivalent,
			SideEffects:             &none,
			TimeoutSeconds:          &seconds,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	api := client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	cur, err := api.Get(ctx, r.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = api.Create(ctx, want, metav1.CreateOptions{})
	case err == nil:
		want.ResourceVersion = cur.ResourceVersion
		_, err = api.Update(ctx, want, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("admission webhook configuration %s: %w", r.Name, err)
	}
	return nil
}

// ServerTLS is the webhook's TLS configuration: its serving certificate
// from getCertificate and, when clientCAs is set, a client certificate
// verified against it required of every caller (the kube-apiserver's, from
// its admission configuration), so nobody else completes a handshake.
func ServerTLS(getCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error), clientCAs *x509.CertPool) *tls.Config {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: getCertificate}
	if clientCAs != nil {
		cfg.ClientAuth, cfg.ClientCAs = tls.RequireAndVerifyClientCert, clientCAs
	}
	return cfg
}
