package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/lease"
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

// webhookTarget is where the kube-apiserver reaches the webhook, and the
// names its certificate must carry.
type webhookTarget struct {
	reg      admission.Registration
	dnsNames []string
	ips      []net.IP
}

// webhookTarget checks the webhook flags.
func (f serverFlags) webhookTarget() (webhookTarget, error) {
	var t webhookTarget
	switch fp := admissionregistrationv1.FailurePolicyType(f.webhookFailurePolicy); fp {
	case admissionregistrationv1.Fail, admissionregistrationv1.Ignore:
		t.reg.FailurePolicy = fp
	default:
		return t, fmt.Errorf("--webhook-failure-policy %q: use Fail or Ignore", f.webhookFailurePolicy)
	}
	switch {
	case (f.webhookURL == "") == (f.webhookService == ""):
		return t, errors.New("--webhook-listen needs exactly one of --webhook-url and --webhook-service")
	case f.webhookURL != "":
		u, err := url.Parse(f.webhookURL)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return t, fmt.Errorf("--webhook-url %q: an https URL is required", f.webhookURL)
		}
		t.reg.URL = f.webhookURL
		if ip := net.ParseIP(u.Hostname()); ip != nil {
			t.ips = append(t.ips, ip)
		} else {
			t.dnsNames = append(t.dnsNames, u.Hostname())
		}
	default:
		nsName, port, _ := strings.Cut(f.webhookService, ":")
		ns, name, ok := strings.Cut(nsName, "/")
		if !ok || ns == "" || name == "" {
			return t, fmt.Errorf("--webhook-service %q: use NAMESPACE/NAME[:PORT]", f.webhookService)
		}
		t.reg.ServiceNamespace, t.reg.ServiceName = ns, name
		if port != "" {
			p, err := strconv.ParseInt(port, 10, 32)
			if err != nil || p < 1 || p > 65535 {
				return t, fmt.Errorf("--webhook-service %q: bad port", f.webhookService)
			}
			t.reg.ServicePort = int32(p)
		}
		t.dnsNames = append(t.dnsNames, name+"."+ns+".svc", name+"."+ns+".svc.cluster.local")
	}
	if f.webhookDNSNames != "" {
		t.dnsNames = splitList(f.webhookDNSNames)
	}
	if f.webhookIPs != "" {
		t.ips = nil
		for _, s := range splitList(f.webhookIPs) {
			ip := net.ParseIP(s)
			if ip == nil {
				return t, fmt.Errorf("--webhook-ips: %q is not an IP address", s)
			}
			t.ips = append(t.ips, ip)
		}
	}
	return t, nil
}

// serveWebhook serves the admission webhook with a certificate from the
// relay CA and registers it (caBundle: the relay roots). It returns a
// function that stops serving.
func (f serverFlags) serveWebhook(ctx context.Context, kube *kubeclient.Clients, authority *ca.Authority, engine *admission.Engine, log *slog.Logger, onceOnly func(lease.Task)) (func(), error) {
	t, err := f.webhookTarget()
	if err != nil {
		return nil, err
	}
	if t.reg.FailurePolicy == admissionregistrationv1.Ignore {
		log.Warn("admission webhook failurePolicy is Ignore: while the webhook is down, objects the rules refuse are created (the in-process check still marks them Invalid)")
	}
	cert, err := server.NewServingCert(ctx, authority, t.dnsNames, t.ips, func(context.Context, []byte, []byte) error { return nil }, log.With("for", "admission-webhook"))
	if err != nil {
		return nil, fmt.Errorf("webhook certificate: %w", err)
	}
	go cert.Run(ctx)
	t.reg.CABundle = ca.CertsPEM(authority.Roots()...)
	// Namespace labels come from a watch; a namespace the watch has not seen
	// yet (created in the same apply) is read once from the API.
	factory := informers.NewSharedInformerFactory(kube.Typed, 10*time.Minute)
	namespaces := factory.Core().V1().Namespaces().Lister()
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	var clientCAs *x509.CertPool
	if f.webhookClientCA != "" {
		b, err := os.ReadFile(f.webhookClientCA)
		if err != nil {
			return nil, fmt.Errorf("--webhook-client-ca: %w", err)
		}
		clientCAs = x509.NewCertPool()
		if !clientCAs.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("--webhook-client-ca %s: no PEM certificate", f.webhookClientCA)
		}
	} else {
		log.Warn("admission webhook accepts callers without a client certificate (--webhook-allow-unauthenticated): anyone who reaches its port can make it judge requests; their decisions are audited as unauthenticated and they spend budgets of their own")
	}
	hook := &admission.Webhook{Engine: engine, Logger: log, Limiter: rate.NewLimiter(webhookRate, webhookBurst), AllowUnauthenticated: clientCAs == nil,
		NamespaceLabels: func(ctx context.Context, ns string) (map[string]string, error) {
			if n, err := namespaces.Get(ns); err == nil {
				return n.Labels, nil
			}
			n, err := kube.Typed.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			if err != nil {
				return nil, err
			}
			return n.Labels, nil
		}}
	mux := http.NewServeMux()
	mux.Handle(admission.WebhookPath, hook)
	lis, err := net.Listen("tcp", f.webhookListen)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: time.Minute,
		TLSConfig: admission.ServerTLS(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert.Certificate() }, clientCAs)}
	go func() { _ = srv.ServeTLS(lis, "", "") }()
	// Every replica serves the webhook; one writes its configuration.
	onceOnly(lease.Task{Name: "webhook-configuration", Run: func(ctx context.Context) {
		for attempt := 0; ; attempt++ {
			err := admission.Register(ctx, kube.Typed, t.reg)
			if err == nil || ctx.Err() != nil {
				return
			}
			delay := min(time.Second<<min(attempt, 5), 30*time.Second)
			log.Error("could not write the admission webhook's configuration; retrying", "error", err, "retry_in", delay)
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
		}
	}})
	log.Info("admission webhook serving", "listen", lis.Addr().String(), "url", t.reg.URL, "service", t.reg.ServiceNamespace+"/"+t.reg.ServiceName,
		"failure_policy", string(t.reg.FailurePolicy), "client_certificate_required", clientCAs != nil)
	return func() { _ = srv.Close() }, nil
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
