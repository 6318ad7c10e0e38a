// Package opsclient reads the operations port of a Relaymesh process (the
// server's :9091, an agent's :9977): /metrics, /healthz, /readyz and the
// server's /debug/* endpoints.
//
// A process is reached directly at an address (a port-forward, a load
// balancer, a process on the same machine), or — for the unauthenticated
// endpoints only — through the management apiserver's service proxy
// (/api/v1/namespaces/NS/services/NAME:PORT/proxy/…), which needs nothing
// but the kubeconfig. The service proxy cannot carry a bearer token to the
// backend (the apiserver removes the Authorization header once it has
// authenticated the caller), so /debug/* is read directly only.
//
// The server's port speaks TLS (RootCAs: the relay root, or the CA of a
// provided certificate); an agent's ports, and a server run with the
// WEAKER --metrics-plain-http, speak plain HTTP.
//
// Bodies are bounded (MaxBody); a bearer token is only ever sent in the
// Authorization header, and never over plain HTTP to a non-loopback
// address, whatever the token (SendToken decides).
package opsclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// MaxBody bounds what is read from one endpoint.
const MaxBody = 32 << 20

// requestTimeout bounds one request.
const requestTimeout = 10 * time.Second

// BuildInfoMetric is the gauge every Relaymesh process exports with its
// version in a label.
const BuildInfoMetric = "relaymesh_build_info"

// Errors.
var (
	// ErrNoAddress: the endpoint needs a direct address and none was given.
	ErrNoAddress = errors.New("no address of the operations port given")
	// ErrCleartextToken: the bearer token would travel in cleartext to
	// another machine.
	ErrCleartextToken = errors.New("refusing to send a bearer token over plain HTTP to a non-loopback address")
	// ErrNoService: the service proxy found no Service of that name.
	ErrNoService = errors.New("no such Service")
	// ErrNoEndpoints: the Service exists, but no ready endpoint backs it.
	ErrNoEndpoints = errors.New("the Service has no ready endpoints")
)

// Client reads one process's operations port.
type Client struct {
	// Address is host:port of the operations port; empty: through the
	// service proxy of Kube (unauthenticated endpoints only).
	Address string
	// Kube reaches the apiserver whose service proxy is used; with
	// Namespace, Service and Port ("metrics": the port's name or number).
	Kube      kubernetes.Interface
	Namespace string
	Service   string
	Port      string
	// RootCAs, when set, makes direct requests HTTPS, the server verified
	// against the pool it returns (called once per request; the relay root
	// from relay-root-tls-secret, or a CA file); nil: plain HTTP.
	RootCAs func(context.Context) (*x509.CertPool, error)
	// Token, when set, is sent as a bearer token on /debug/* requests:
	// over HTTPS, or over plain HTTP to a loopback address only.
	Token string
	// HTTP is the client for direct requests; default one with a timeout
	// (its transport is replaced by one verifying RootCAs when they are
	// set).
	HTTP *http.Client
	// DirectHint says how the caller gives a direct address (e.g. "pass
	// --server-metrics-address HOST:PORT"); it ends the message of a
	// service-proxy request that found no Service or no endpoint.
	DirectHint string

	// maxBody bounds a response body; 0: MaxBody. Tests lower it: reading
	// MaxBody+1 bytes under -race on a loaded machine nears requestTimeout.
	maxBody int
}

// Where describes how the process is reached, for messages.
func (c *Client) Where() string {
	if c.Address != "" {
		return c.scheme() + "://" + c.Address
	}
	return fmt.Sprintf("service proxy %s/%s", c.Namespace, c.proxiedName())
}

func (c *Client) scheme() string {
	if c.RootCAs != nil {
		return "https"
	}
	return "http"
}

// TokenAllowed says whether Token may be sent to the direct address as
// the client reaches it (SendToken); nil without an address (the service
// proxy carries no token).
func (c *Client) TokenAllowed() error {
	if c.Address == "" {
		return nil
	}
	return SendToken(c.scheme(), c.Address)
}

// SendToken decides whether a bearer token may go to address over
// scheme ("http" or "https"): over HTTPS always (the server is
// verified), over plain HTTP to a loopback address only (a port-forward,
// a process on this machine); otherwise ErrCleartextToken, naming the
// fix. The error never quotes the token.
func SendToken(scheme, address string) error {
	if scheme == "https" || loopback(address) {
		return nil
	}
	return fmt.Errorf("%w (%s): serve the metrics port over TLS (the server's default) and reach it with HTTPS, or reach a plain-HTTP port through a port-forward to 127.0.0.1", ErrCleartextToken, address)
}

// Get fetches path ("/metrics", "/debug/snapshots/input", …).
func (c *Client) Get(ctx context.Context, path string) ([]byte, error) {
	if !strings.HasPrefix(path, "/") {
		return nil, fmt.Errorf("path %q must start with /", path)
	}
	debug := strings.HasPrefix(path, "/debug/")
	if c.Address == "" {
		if debug {
			return nil, fmt.Errorf("%s: %w (the apiserver's service proxy does not pass bearer tokens on)", path, ErrNoAddress)
		}
		if c.Kube == nil || c.Service == "" {
			return nil, ErrNoAddress
		}
		return c.viaProxy(ctx, path)
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.scheme()+"://"+c.Address+path, nil)
	if err != nil {
		return nil, err
	}
	if debug && c.Token != "" {
		if err := SendToken(c.scheme(), c.Address); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	hc, err := c.httpClient(ctx)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := readBounded(resp.Body, c.bodyLimit())
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return body, fmt.Errorf("GET %s: %s: %s", path, resp.Status, firstLine(body))
	}
	return body, nil
}

// httpClient is the client of a direct request: c.HTTP (or one with a
// timeout), over TLS verifying RootCAs when they are set. It never
// follows a redirect, which could carry the token elsewhere.
func (c *Client) httpClient(ctx context.Context) (*http.Client, error) {
	hc := &http.Client{Timeout: requestTimeout}
	if c.HTTP != nil {
		copied := *c.HTTP
		hc = &copied
	}
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	if c.RootCAs == nil {
		return hc, nil
	}
	roots, err := c.RootCAs(ctx)
	if err != nil {
		return nil, fmt.Errorf("the CA to verify the metrics port with: %w", err)
	}
	if roots == nil {
		return nil, errors.New("the CA to verify the metrics port with: empty")
	}
	hc.Transport = &http.Transport{Proxy: http.ProxyFromEnvironment, TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots},
		TLSHandshakeTimeout: requestTimeout, ForceAttemptHTTP2: true}
	return hc, nil
}

// proxiedName is the Service and port as the service proxy names them,
// "https:" first when the port speaks TLS (the apiserver then dials it
// with TLS; it does not verify the certificate, so only the
// unauthenticated endpoints go this way).
func (c *Client) proxiedName() string {
	name := c.Service
	if c.Port != "" {
		name += ":" + c.Port
	}
	if c.RootCAs != nil {
		name = "https:" + name
	}
	return name
}

func (c *Client) viaProxy(ctx context.Context, path string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	name := c.proxiedName()
	rc, err := c.Kube.CoreV1().RESTClient().Get().Namespace(c.Namespace).Resource("services").Name(name).SubResource("proxy").Suffix(path).Stream(ctx)
	if err != nil {
		if why := c.whyUnproxied(ctx, err); why != nil {
			err = why
		}
		return nil, fmt.Errorf("GET %s through the service proxy of %s/%s: %w", path, c.Namespace, name, err)
	}
	defer rc.Close()
	return readBounded(rc, c.bodyLimit())
}

// whyUnproxied explains a service-proxy request the apiserver answered with
// NotFound or ServiceUnavailable: the apiserver says "not found" both for a
// Service that does not exist and for one without an Endpoints object
// (a Service whose pods are not ready, or a server run outside the
// cluster behind a Service nobody feeds). It returns nil when it cannot
// tell (err is then the best message).
func (c *Client) whyUnproxied(ctx context.Context, err error) error {
	if !apierrors.IsNotFound(err) && !apierrors.IsServiceUnavailable(err) {
		return nil
	}
	hint := ""
	if c.DirectHint != "" {
		hint = "; " + c.DirectHint
	}
	svc, getErr := c.Kube.CoreV1().Services(c.Namespace).Get(ctx, c.Service, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(getErr):
		return unproxiedError{ErrNoService, fmt.Sprintf("no Service %s/%s (is the server installed in namespace %s, under another name, or running outside the cluster?)%s", c.Namespace, c.Service, c.Namespace, hint)}
	case getErr != nil:
		return nil
	}
	ready, known := readyEndpoints(ctx, c.Kube, c.Namespace, svc.Name)
	if known && ready > 0 {
		return nil
	}
	return unproxiedError{ErrNoEndpoints, fmt.Sprintf("Service %s/%s exists, but no ready pod backs it (no server pod is ready yet, or the server runs outside the cluster, by hand or in the demo, and nothing feeds the Service)%s", c.Namespace, c.Service, hint)}
}

// unproxiedError says why the service proxy could not reach the process;
// errors.Is matches its kind (ErrNoService, ErrNoEndpoints).
type unproxiedError struct {
	kind error
	msg  string
}

func (e unproxiedError) Error() string        { return e.msg }
func (e unproxiedError) Is(target error) bool { return target == e.kind }

// readyEndpoints counts the ready addresses of Service ns/name as the
// service proxy sees them (its Endpoints object); known is false when they
// cannot be read.
func readyEndpoints(ctx context.Context, kube kubernetes.Interface, ns, name string) (ready int, known bool) {
	// The apiserver's service proxy reads Endpoints (not EndpointSlices),
	// so they are what tells whether it can proxy.
	eps, err := kube.CoreV1().Endpoints(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return 0, true
	case err != nil:
		return 0, false
	}
	for _, s := range eps.Subsets {
		ready += len(s.Addresses)
	}
	return ready, true
}

func (c *Client) bodyLimit() int {
	if c.maxBody > 0 {
		return c.maxBody
	}
	return MaxBody
}

// readBounded reads at most limit bytes, failing on more.
func readBounded(r io.Reader, limit int) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return nil, err
	}
	if len(b) > limit {
		return nil, fmt.Errorf("response larger than %d bytes", limit)
	}
	return b, nil
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// loopback reports whether host:port names a loopback address.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Metrics are parsed Prometheus metric families by name.
type Metrics map[string]*dto.MetricFamily

// ParseMetrics parses the Prometheus text format.
func ParseMetrics(b []byte) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(b)))
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	return Metrics(fams), nil
}

// Value is the value of the sample of name whose labels include match (all
// of them), and whether there is one.
func (m Metrics) Value(name string, match map[string]string) (float64, bool) {
	fam := m[name]
	if fam == nil {
		return 0, false
	}
	for _, s := range fam.GetMetric() {
		if !labelsMatch(s, match) {
			continue
		}
		switch {
		case s.GetGauge() != nil:
			return s.GetGauge().GetValue(), true
		case s.GetCounter() != nil:
			return s.GetCounter().GetValue(), true
		case s.GetUntyped() != nil:
			return s.GetUntyped().GetValue(), true
		}
	}
	return 0, false
}

// Label is the value of label of the first sample of name, and whether
// there is one.
func (m Metrics) Label(name, label string) (string, bool) {
	fam := m[name]
	if fam == nil || len(fam.GetMetric()) == 0 {
		return "", false
	}
	for _, l := range fam.GetMetric()[0].GetLabel() {
		if l.GetName() == label {
			return l.GetValue(), true
		}
	}
	return "", false
}

func labelsMatch(s *dto.Metric, match map[string]string) bool {
	have := map[string]string{}
	for _, l := range s.GetLabel() {
		have[l.GetName()] = l.GetValue()
	}
	for k, v := range match {
		if have[k] != v {
			return false
		}
	}
	return true
}

// Version is the version label of the process's build-info metric.
func Version(m Metrics) (string, error) {
	v, ok := m.Label(BuildInfoMetric, "version")
	if !ok {
		return "", fmt.Errorf("no %s metric (a relaymesh older than this client?)", BuildInfoMetric)
	}
	return v, nil
}
