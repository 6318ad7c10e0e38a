package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/policy/admission"
	"github.com/relaymesh/relaymesh/server"
	"golang.org/x/time/rate"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
)

// The webhook judges (and audits) at most webhookRate requests per second,
// webhookBurst at once: far above what one control plane sends, far below
// what would flood the audit log.
const (
	webhookRate  = 50
	webhookBurst = 200
)

// WebhookTarget is where the kube-apiserver reaches the webhook, and the
// names its certificate must carry.
type WebhookTarget struct {
	Registration admission.Registration
	DNSNames     []string
	IPs          []net.IP
}

// Target checks the webhook's configuration and says where the apiserver
// reaches it.
func (w WebhookConfig) Target() (WebhookTarget, error) {
	var t WebhookTarget
	switch fp := admissionregistrationv1.FailurePolicyType(w.FailurePolicy); fp {
	case admissionregistrationv1.Fail, admissionregistrationv1.Ignore:
		t.Registration.FailurePolicy = fp
	default:
		return t, fmt.Errorf("--webhook-failure-policy %q: use Fail or Ignore", w.FailurePolicy)
	}
	switch {
	case (w.URL == "") == (w.Service == ""):
		return t, errors.New("--webhook-listen needs exactly one of --webhook-url and --webhook-service")
	case w.URL != "":
		u, err := url.Parse(w.URL)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return t, fmt.Errorf("--webhook-url %q: an https URL is required", w.URL)
		}
		t.Registration.URL = w.URL
		if ip := net.ParseIP(u.Hostname()); ip != nil {
			t.IPs = append(t.IPs, ip)
		} else {
			t.DNSNames = append(t.DNSNames, u.Hostname())
		}
	default:
		if err := t.service(w.Service); err != nil {
			return t, err
		}
	}
	if len(w.DNSNames) > 0 {
		t.DNSNames = w.DNSNames
	}
	if len(w.IPs) > 0 {
		ips, err := parseIPs("--webhook-ips", w.IPs)
		if err != nil {
			return t, err
		}
		t.IPs = ips
	}
	return t, nil
}

// service sets the registration's Service (NAMESPACE/NAME[:PORT]) and its
// names.
func (t *WebhookTarget) service(s string) error {
	nsName, port, _ := strings.Cut(s, ":")
	ns, name, ok := strings.Cut(nsName, "/")
	if !ok || ns == "" || name == "" {
		return fmt.Errorf("--webhook-service %q: use NAMESPACE/NAME[:PORT]", s)
	}
	t.Registration.ServiceNamespace, t.Registration.ServiceName = ns, name
	if port != "" {
		p, err := strconv.ParseInt(port, 10, 32)
		if err != nil || p < 1 || p > 65535 {
			return fmt.Errorf("--webhook-service %q: bad port", s)
		}
		t.Registration.ServicePort = int32(p)
	}
	t.DNSNames = append(t.DNSNames, name+"."+ns+".svc", name+"."+ns+".svc.cluster.local")
	return nil
}

// newWebhook serves the admission webhook with a certificate from the
// relay CA; the once-only task webhook-configuration registers it
// (caBundle: the relay roots). Serving stops when the process does.
func (p *process) newWebhook(ctx context.Context) error {
	w := p.cfg.Webhook
	if w.Listen == "" {
		p.log.Warn("no admission webhook (--webhook-listen): objects the rules refuse can be created, and are marked Invalid and not translated")
		return nil
	}
	t, err := w.Target()
	if err != nil {
		return err
	}
	if t.Registration.FailurePolicy == admissionregistrationv1.Ignore {
		p.log.Warn("admission webhook failurePolicy is Ignore: while the webhook is down, objects the rules refuse are created (the in-process check still marks them Invalid)")
	}
	log := p.log.With("for", "admission-webhook")
	cert, err := server.NewServingCert(ctx, p.authority, t.DNSNames, t.IPs, func(context.Context, []byte, []byte) error { return nil }, log)
	if err != nil {
		return fmt.Errorf("webhook certificate: %w", err)
	}
	go cert.Run(ctx)
	t.Registration.CABundle = ca.CertsPEM(p.authority.Roots()...)
	clientCAs, err := p.webhookClientCAs()
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle(admission.WebhookPath, &admission.Webhook{Engine: p.admitter, Logger: p.log, Limiter: rate.NewLimiter(webhookRate, webhookBurst),
		AllowUnauthenticated: clientCAs == nil, NamespaceLabels: p.namespaceLabels(ctx)})
	lis, err := net.Listen("tcp", w.Listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: time.Minute,
		TLSConfig: admission.ServerTLS(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert.Certificate() }, clientCAs)}
	go func() { _ = srv.ServeTLS(lis, "", "") }()
	p.closers = append(p.closers, func() { _ = srv.Close() })
	p.webhook, p.addrs.Webhook = &t.Registration, lis.Addr().String()
	p.reg.MustRegister(webhookInfo(clientCAs != nil, w.FailurePolicy))
	p.log.Info("admission webhook serving", "listen", lis.Addr().String(), "url", t.Registration.URL,
		"service", t.Registration.ServiceNamespace+"/"+t.Registration.ServiceName,
		"failure_policy", string(t.Registration.FailurePolicy), "client_certificate_required", clientCAs != nil)
	return nil
}

// webhookClientCAs are the CAs of the apiserver's client certificate (nil:
// WEAKER, callers without one are answered).
func (p *process) webhookClientCAs() (*x509.CertPool, error) {
	file := p.cfg.Webhook.ClientCAFile
	if file == "" {
		p.log.Warn("admission webhook accepts callers without a client certificate (--webhook-allow-unauthenticated): anyone who reaches its port can make it judge requests; their decisions are audited as unauthenticated and they spend budgets of their own")
		return nil, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--webhook-client-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("--webhook-client-ca %s: no PEM certificate", file)
	}
	return pool, nil
}

// namespaceLabels reads namespace labels from a watch; a namespace the
// watch has not seen yet (created in the same apply) is read once from the
// API.
func (p *process) namespaceLabels(ctx context.Context) func(context.Context, string) (map[string]string, error) {
	factory := informers.NewSharedInformerFactory(p.kube.Typed, 10*time.Minute)
	namespaces := factory.Core().V1().Namespaces().Lister()
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	return func(ctx context.Context, ns string) (map[string]string, error) {
		if n, err := namespaces.Get(ns); err == nil {
			return n.Labels, nil
		}
		n, err := p.kube.Typed.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return n.Labels, nil
	}
}

// registerWebhook writes the webhook's configuration, retrying with
// backoff until it is written or ctx ends (the once-only task
// webhook-configuration: every replica serves the webhook, one writes it).
func (p *process) registerWebhook(ctx context.Context) {
	for attempt := 0; ; attempt++ {
		err := admission.Register(ctx, p.kube.Typed, *p.webhook)
		if err == nil || ctx.Err() != nil {
			return
		}
		delay := min(time.Second<<min(attempt, 5), 30*time.Second)
		p.log.Error("could not write the admission webhook's configuration; retrying", "error", err, "retry_in", delay)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// metricWebhookInfo says how the admission webhook is served (relaymesh
// check reads it).
const metricWebhookInfo = "relaymesh_admission_webhook_info"

// webhookInfo is the relaymesh_admission_webhook_info gauge: 1, with
// client_auth "certificate" (only the apiserver's client certificate is
// answered) or "none" (WEAKER: --webhook-allow-unauthenticated), and the
// failure policy registered.
func webhookInfo(clientCert bool, failurePolicy string) prometheus.Collector {
	auth := "none"
	if clientCert {
		auth = "certificate"
	}
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: metricWebhookInfo,
		Help: "Always 1 while the admission webhook is served; client_auth is certificate (only the kube-apiserver's client certificate is answered) or none (--webhook-allow-unauthenticated), failure_policy the one registered."},
		[]string{"client_auth", "failure_policy"})
	g.WithLabelValues(auth, failurePolicy).Set(1)
	return g
}
