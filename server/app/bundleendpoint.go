package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/relaymesh/relaymesh/dashboard"
	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/relaymesh/relaymesh/trust/spiffefed"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// The SPIFFE bundle endpoint (docs/spiffe-federation.md,
// docs/design/2026-12-02-spiffe-bundle-endpoint.md): every replica serves
// the bundles stored in one ConfigMap; only the Lease holder (or the only
// replica) writes it, from the trust requests its trust controller
// published, so every replica serves one sequence per trust domain.
const (
	// BundleConfigMap holds the published bundles (spiffefed.State) under
	// BundleStateKey.
	BundleConfigMap = "relaymesh-spiffe-bundles"
	BundleStateKey  = "state.json"
	// bundleResync is how often the Lease holder checks the published
	// bundles against the trust requests besides every publish.
	bundleResync = 10 * time.Second
)

// BundleEndpointConfig is the SPIFFE bundle endpoint: off without Listen.
type BundleEndpointConfig struct {
	// Listen serves GET /bundles/<trust domain> (--spiffe-bundle-listen);
	// empty: off.
	Listen string
	// SPIFFEListen serves the same bundles with the https_spiffe profile
	// (--spiffe-bundle-spiffe-listen): with an X509-SVID for EndpointID
	// (--spiffe-bundle-endpoint-id) from the root of the VirtualMesh of
	// its trust domain. Needs Listen; empty: off.
	SPIFFEListen string
	EndpointID   string
	// CertFile and KeyFile are the https_web serving certificate and key,
	// reloaded when they change (--spiffe-bundle-tls-cert,
	// --spiffe-bundle-tls-key); empty: a certificate from the relay CA for
	// DNSNames and IPs.
	CertFile, KeyFile string
	// DNSNames and IPs of the relay-CA certificate
	// (--spiffe-bundle-dns-names, --spiffe-bundle-ips); empty: the
	// server's.
	DNSNames, IPs []string
	// RefreshHint is every bundle's spiffe_refresh_hint
	// (--spiffe-bundle-refresh-hint).
	RefreshHint time.Duration
	// PeerPoll is the longest a federated peer may take to fetch a bundle
	// again regardless of the refresh hint (--spiffe-bundle-peer-poll;
	// Istio's spiffeBundleUrl: every 30 minutes). A root rotation waits
	// three refresh hints plus PeerPoll after publishing the new root
	// before anything is issued from it.
	PeerPoll time.Duration
}

// DefaultPeerPoll is Istio's poll period of a caCertificates
// spiffeBundleUrl (RemoteDefaultPollPeriod in pilot/pkg/trustbundle).
const DefaultPeerPoll = 30 * time.Minute

// FederationWait is how long a rotation's new root is published before
// anything is issued from it: zero while the endpoint is off.
func (b BundleEndpointConfig) FederationWait() time.Duration {
	if b.Listen == "" {
		return 0
	}
	return 3*b.RefreshHint + b.PeerPoll
}

func (b BundleEndpointConfig) validate() []error {
	var errs []error
	if (b.CertFile == "") != (b.KeyFile == "") {
		errs = append(errs, errors.New("--spiffe-bundle-tls-cert and --spiffe-bundle-tls-key go together"))
	}
	if b.Listen == "" && (b.CertFile != "" || len(b.DNSNames) > 0 || len(b.IPs) > 0) {
		errs = append(errs, errors.New("--spiffe-bundle-tls-cert, --spiffe-bundle-dns-names and --spiffe-bundle-ips need --spiffe-bundle-listen"))
	}
	// A zero hint is no hint: wrong only when the endpoint is served.
	if (b.Listen != "" || b.RefreshHint != 0) && (b.RefreshHint < spiffefed.MinRefreshHint || b.RefreshHint > spiffefed.MaxRefreshHint) {
		errs = append(errs, fmt.Errorf("--spiffe-bundle-refresh-hint %v: must be in [%v, %v]", b.RefreshHint, spiffefed.MinRefreshHint, spiffefed.MaxRefreshHint))
	}
	switch {
	case b.SPIFFEListen != "" && b.Listen == "":
		errs = append(errs, errors.New("--spiffe-bundle-spiffe-listen needs --spiffe-bundle-listen (the https_web endpoint, which publishes the bundles)"))
	case b.SPIFFEListen != "" && b.EndpointID == "":
		errs = append(errs, errors.New("--spiffe-bundle-spiffe-listen needs --spiffe-bundle-endpoint-id, e.g. spiffe://cluster-1.local/relaymesh/bundle-endpoint"))
	case b.SPIFFEListen == "" && b.EndpointID != "":
		errs = append(errs, errors.New("--spiffe-bundle-endpoint-id needs --spiffe-bundle-spiffe-listen"))
	case b.EndpointID != "":
		if id, err := spiffeid.FromString(b.EndpointID); err != nil {
			errs = append(errs, fmt.Errorf("--spiffe-bundle-endpoint-id %q: %w", text.Truncate(b.EndpointID, 80), err))
		} else if _, err := spiffefed.ParseTrustDomain(id.TrustDomain().Name()); err != nil || id.Path() == "" {
			errs = append(errs, fmt.Errorf("--spiffe-bundle-endpoint-id %q: a SPIFFE ID with a path in a trust domain a VirtualMesh can publish", text.Truncate(b.EndpointID, 80)))
		}
	}
	if b.PeerPoll < 0 || b.PeerPoll > 24*time.Hour {
		errs = append(errs, fmt.Errorf("--spiffe-bundle-peer-poll %v: must be in [0s, 24h]", b.PeerPoll))
	}
	if _, err := parseIPs("--spiffe-bundle-ips", b.IPs); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// Metrics of the SPIFFE bundle endpoint: what this replica serves.
const (
	// MetricSPIFFEBundleSequence is each served bundle's spiffe_sequence.
	MetricSPIFFEBundleSequence = "relaymesh_spiffe_bundle_sequence"
	// MetricSPIFFEBundlePublished is when each served bundle's roots were
	// first published.
	MetricSPIFFEBundlePublished = "relaymesh_spiffe_bundle_published_timestamp_seconds"
	// MetricSPIFFEBundleSVIDExpiry is the https_spiffe X509-SVID's
	// NotAfter.
	MetricSPIFFEBundleSVIDExpiry = "relaymesh_spiffe_bundle_endpoint_svid_expiry_timestamp_seconds"
)

// bundleEndpoint publishes and serves the VirtualMeshes' SPIFFE bundles.
type bundleEndpoint struct {
	kube      kubernetes.Interface
	namespace string
	hint      time.Duration
	log       *slog.Logger
	clock     func() time.Time
	// members are the trust requests this replica's trust controller
	// published; leading whether it may write.
	members func() []spiffefed.Member
	leading func() bool
	lister  cache.Indexer
	served  atomic.Pointer[spiffefed.Snapshot]
	// loaded is called after a new stored state is served (the trust
	// controller's rotation waits on what is published).
	loaded func()
	// sequence and published are the served bundles' metrics.
	sequence, published *prometheus.GaugeVec
	wake                chan struct{}
	refused             string // the refusals last logged
}

// newBundleEndpoint serves the SPIFFE bundle endpoint if
// --spiffe-bundle-listen is set.
func (p *process) newBundleEndpoint(ctx context.Context) error {
	c := p.cfg.SPIFFEBundle
	if c.Listen == "" {
		return nil
	}
	b := &bundleEndpoint{kube: p.kube.Typed, namespace: p.cfg.Namespace, hint: c.RefreshHint, log: p.log.With("part", "spiffe-bundle-endpoint"),
		clock: time.Now, members: func() []spiffefed.Member { return trustMembers(p.outputs, p.log) }, leading: p.reps.leading, wake: make(chan struct{}, 1),
		loaded: p.trust.Kick,
		sequence: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricSPIFFEBundleSequence,
			Help: "spiffe_sequence of each trust domain's bundle this replica serves at the SPIFFE bundle endpoint."}, []string{"trust_domain"}),
		published: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricSPIFFEBundlePublished,
			Help: "When the roots of each trust domain's bundle this replica serves were first published, in Unix seconds (0: not recorded); a rotation issues from a new root 3 refresh hints + --spiffe-bundle-peer-poll after it."}, []string{"trust_domain"})}
	if err := p.reg.Register(b.sequence); err != nil {
		return err
	}
	if err := p.reg.Register(b.published); err != nil {
		return err
	}
	if err := b.start(ctx); err != nil {
		return err
	}
	p.bundles.Store(b)
	p.trust.Kick()
	p.outputs.OnPublish(func(string) { b.kick() })
	get, err := p.bundleCertificate(ctx)
	if err != nil {
		return err
	}
	if p.addrs.SPIFFEBundle, err = b.serve(p, "--spiffe-bundle-listen", c.Listen, spiffefed.WebTLS(get)); err != nil {
		return err
	}
	b.log.Info("SPIFFE bundle endpoint listening (https_web; unauthenticated and public by design)", "address", p.addrs.SPIFFEBundle,
		"path", spiffefed.PathPrefix+"<trust domain>", "refresh_hint", c.RefreshHint, "rotation_wait", c.FederationWait())
	if c.SPIFFEListen == "" {
		return nil
	}
	id := spiffeid.RequireFromString(c.EndpointID) // validated
	svid := &endpointSVID{id: id, trust: p.trust, log: b.log.With("profile", "https_spiffe", "spiffe_id", id.String())}
	if err := p.reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: MetricSPIFFEBundleSVIDExpiry,
		Help: "NotAfter of the X509-SVID the https_spiffe bundle endpoint serves, in Unix seconds (0: none yet); it is issued anew at 2/3 of its 24h life."},
		svid.expiry)); err != nil {
		return err
	}
	svid.refresh(ctx)
	go svid.run(ctx)
	if p.addrs.SPIFFEBundleSPIFFE, err = b.serve(p, "--spiffe-bundle-spiffe-listen", c.SPIFFEListen, spiffefed.SPIFFETLS(svid)); err != nil {
		return err
	}
	b.log.Info("SPIFFE bundle endpoint listening (https_spiffe; unauthenticated and public by design)", "address", p.addrs.SPIFFEBundleSPIFFE,
		"spiffe_id", id.String())
	return nil
}

// serve serves the bundles on addr (the value of flag) with tlsConfig,
// until the process closes, and returns the address listened on.
func (b *bundleEndpoint) serve(p *process, flag, addr string, tlsConfig *tls.Config) (string, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	srv := spiffefed.Server(spiffefed.Handler(b.served.Load), tlsConfig)
	srv.ErrorLog = log.New(slogWriter{b.log}, "", 0)
	go func() { _ = srv.ServeTLS(lis, "", "") }()
	p.closers = append(p.closers, func() { _ = srv.Close() })
	return lis.Addr().String(), nil
}

// endpointSVIDTTL is the https_spiffe SVID's lifetime; it is issued anew
// at two thirds of it, and at once when the rotation moves the issuing
// root.
const endpointSVIDTTL = 24 * time.Hour

// endpointSVID keeps the https_spiffe endpoint's X509-SVID issued from
// the root its trust domain's VirtualMesh issues from now.
type endpointSVID struct {
	id    spiffeid.ID
	trust *trust.Controller
	log   *slog.Logger
	cur   atomic.Pointer[x509svid.SVID]
	// Written by refresh only (run's goroutine, or before it starts).
	issuer  string
	renewAt time.Time
	lastErr string
}

// expiry is the served SVID's NotAfter in Unix seconds; 0: none.
func (e *endpointSVID) expiry() float64 {
	if s := e.cur.Load(); s != nil {
		return float64(s.Certificates[0].NotAfter.Unix())
	}
	return 0
}

// GetX509SVID is the SVID served; none yet: handshakes fail.
func (e *endpointSVID) GetX509SVID() (*x509svid.SVID, error) {
	if s := e.cur.Load(); s != nil {
		return s, nil
	}
	return nil, errors.New("no X509-SVID for the bundle endpoint yet")
}

func (e *endpointSVID) run(ctx context.Context) {
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			e.refresh(ctx)
		}
	}
}

// refresh issues the SVID anew when there is none, the issuing root
// changed or two thirds of its life passed. Without an issuer the SVID
// served stays until it expires.
func (e *endpointSVID) refresh(ctx context.Context) {
	fail := func(err error) {
		if msg := err.Error(); msg != e.lastErr {
			e.lastErr = msg
			e.log.Error("cannot issue the https_spiffe bundle endpoint's X509-SVID; the one served stays until it expires", "error", msg)
		}
	}
	fp, err := e.trust.EndpointIssuer(e.id.TrustDomain().Name())
	if err != nil {
		fail(err)
		return
	}
	if e.cur.Load() != nil && fp == e.issuer && time.Now().Before(e.renewAt) {
		return
	}
	svid, fp, err := e.trust.EndpointSVID(ctx, e.id, endpointSVIDTTL)
	if err != nil {
		fail(err)
		return
	}
	leaf := svid.Certificates[0]
	e.cur.Store(svid)
	e.issuer, e.lastErr = fp, ""
	e.renewAt = leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) * 2 / 3)
	e.log.Info("issued the https_spiffe bundle endpoint's X509-SVID", "issuing_root", fp[:min(16, len(fp))], "not_after", leaf.NotAfter.UTC().Format(time.RFC3339))
}

// rootPublished is trust.Config.RootPublished: what the endpoint serves;
// before it serves a loaded state, not published.
func (p *process) rootPublished(trustDomains []string, root *x509.Certificate) (time.Time, error) {
	b := p.bundles.Load()
	if b == nil {
		return time.Time{}, errors.New("the bundle endpoint is not serving yet")
	}
	return b.served.Load().RootPublished(trustDomains, root)
}

// bundleCertificate is the https_web certificate: provided files, or one
// from the relay CA (renewed until ctx ends).
func (p *process) bundleCertificate(ctx context.Context) (func() (*tls.Certificate, error), error) {
	c := p.cfg.SPIFFEBundle
	if c.CertFile != "" {
		files, err := dashboard.LoadCertificateFiles(c.CertFile, c.KeyFile, time.Now, p.log.With("for", "spiffe-bundle-endpoint"))
		if err != nil {
			return nil, fmt.Errorf("--spiffe-bundle-tls-cert: %w", err)
		}
		return files.Certificate, nil
	}
	names, ipList := c.DNSNames, c.IPs
	if len(names) == 0 && len(ipList) == 0 {
		names, ipList = p.cfg.ServerDNSNames, p.cfg.ServerIPs
	}
	ips, err := parseIPs("--spiffe-bundle-ips", ipList)
	if err != nil {
		return nil, err
	}
	cert, err := server.NewServingCert(ctx, p.authority, names, ips, nil, p.log.With("for", "spiffe-bundle-endpoint"))
	if err != nil {
		return nil, fmt.Errorf("the SPIFFE bundle endpoint's certificate: %w", err)
	}
	go cert.Run(ctx)
	return cert.Certificate, nil
}

// start watches the stored bundles (every replica serves them) and runs
// the writer (which writes only while leading).
func (b *bundleEndpoint) start(ctx context.Context) error {
	b.served.Store(&spiffefed.Snapshot{})
	f := informers.NewSharedInformerFactoryWithOptions(b.kube, 10*time.Minute, informers.WithNamespace(b.namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + BundleConfigMap }))
	inf := f.Core().V1().ConfigMaps().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { b.load(o) },
		UpdateFunc: func(_, o any) { b.load(o) },
		// Deleted: the last bundles stay served; the writer stores them
		// again, with sequences above the clock.
		DeleteFunc: func(any) { b.kick() },
	}); err != nil {
		return err
	}
	b.lister = inf.GetIndexer()
	f.Start(ctx.Done())
	syncCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), inf.HasSynced) {
		return fmt.Errorf("the SPIFFE bundle endpoint: ConfigMap %s/%s did not sync within a minute", b.namespace, BundleConfigMap)
	}
	go b.run(ctx)
	return nil
}

func (b *bundleEndpoint) kick() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// load serves the bundles a stored ConfigMap holds; one that does not
// decode is refused and the bundles served before stay.
func (b *bundleEndpoint) load(o any) {
	cm, ok := o.(*corev1.ConfigMap)
	if !ok {
		return
	}
	st, err := spiffefed.Decode([]byte(cm.Data[BundleStateKey]))
	if err == nil {
		var snap *spiffefed.Snapshot
		if snap, err = spiffefed.NewSnapshot(st, b.hint); err == nil {
			b.served.Store(snap)
			b.observe(snap)
			if b.loaded != nil {
				b.loaded()
			}
			return
		}
	}
	b.log.Error("the stored SPIFFE bundles are refused; the bundles served before stay", "configmap", BundleConfigMap, "error", err)
	b.kick()
}

// observe sets the served bundles' metrics to snap's.
func (b *bundleEndpoint) observe(snap *spiffefed.Snapshot) {
	if b.sequence == nil {
		return
	}
	b.sequence.Reset()
	b.published.Reset()
	for td, seq := range snap.Sequences() {
		b.sequence.WithLabelValues(td).Set(float64(seq))
	}
	for td, at := range snap.PublishedAt() {
		v := 0.0
		if !at.IsZero() {
			v = float64(at.Unix())
		}
		b.published.WithLabelValues(td).Set(v)
	}
}

// run writes the bundles while this replica leads, after every publish
// and every bundleResync.
func (b *bundleEndpoint) run(ctx context.Context) {
	tick := time.NewTicker(bundleResync)
	defer tick.Stop()
	for {
		if b.leading() {
			if err := b.write(ctx); err != nil && ctx.Err() == nil {
				b.log.Warn("could not store the SPIFFE bundles; trying again", "error", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-b.wake:
		case <-tick.C:
		}
	}
}

// write stores the bundles of the trust requests published now, if they
// changed, on condition that the stored ConfigMap is the one read (a
// conflict is tried again at the next wake).
func (b *bundleEndpoint) write(ctx context.Context) error {
	var prev spiffefed.State
	var cur *corev1.ConfigMap
	if o, ok, err := b.lister.GetByKey(b.namespace + "/" + BundleConfigMap); err == nil && ok {
		cur, _ = o.(*corev1.ConfigMap)
	}
	if cur != nil {
		st, err := spiffefed.Decode([]byte(cur.Data[BundleStateKey]))
		if err != nil {
			// Starts again: sequences above the clock are still above
			// every sequence given before.
			b.log.Error("the stored SPIFFE bundles are refused; storing them anew", "error", err)
		} else {
			prev = st
		}
	}
	// A lost or refused store starts above every sequence this replica
	// serves, as well as above the clock.
	for _, seq := range b.served.Load().Sequences() {
		prev.Counter = max(prev.Counter, seq)
	}
	next, rep := spiffefed.Next(prev, b.members(), b.clock())
	b.logRefusals(rep.Refused)
	if rep.Empty() && cur != nil && prev.Bundles != nil {
		return nil
	}
	if rep.Empty() && cur == nil && len(next.Bundles) == 0 {
		return nil
	}
	data, err := spiffefed.Encode(next)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cms := b.kube.CoreV1().ConfigMaps(b.namespace)
	if cur == nil {
		_, err = cms.Create(wctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: BundleConfigMap, Namespace: b.namespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "relaymesh"}}, Data: map[string]string{BundleStateKey: string(data)}}, metav1.CreateOptions{})
	} else {
		// A merge patch carrying cur's resourceVersion is conditional on
		// it, as an update is; the server's Role grants patch on
		// ConfigMaps, not update (the output heads and ack records are
		// patched too). Other keys someone added are removed.
		set := map[string]any{BundleStateKey: string(data)}
		for k := range cur.Data {
			if k != BundleStateKey {
				set[k] = nil
			}
		}
		var body []byte
		if body, err = json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": cur.ResourceVersion}, "data": set}); err != nil {
			return err
		}
		_, err = cms.Patch(wctx, BundleConfigMap, types.MergePatchType, body, metav1.PatchOptions{})
	}
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		b.kick()
		return nil // read afresh at the next wake
	}
	if err != nil {
		return err
	}
	b.log.Info("SPIFFE bundles published", "changed", rep.Changed, "removed", rep.Removed, "stamped", rep.Stamped)
	return nil
}

func (b *bundleEndpoint) logRefusals(refused []spiffefed.Refusal) {
	var parts []string
	for _, r := range refused {
		parts = append(parts, r.TrustDomain+": "+r.Reason)
	}
	s := strings.Join(parts, "; ")
	if s == b.refused {
		return
	}
	b.refused = s
	if s != "" {
		b.log.Error("trust domains not published at the SPIFFE bundle endpoint", "refused", text.Truncate(s, 2048))
	}
}

// trustMembers are the trust requests this replica published, every
// cluster's.
func trustMembers(outputs *server.Outputs, log *slog.Logger) []spiffefed.Member {
	all := outputs.All()
	clusters := make([]string, 0, len(all))
	for c := range all {
		clusters = append(clusters, c)
	}
	slices.Sort(clusters)
	var out []spiffefed.Member
	for _, c := range clusters {
		for _, req := range all[c].GetTrust() {
			m := spiffefed.Member{VirtualMesh: req.GetVirtualMesh(), TrustDomain: req.GetTrustDomain()}
			if !req.GetHold() && len(req.GetRootBundle()) > 0 {
				roots, err := spiffefed.ParseMeshRoots(req.GetRootBundle())
				if err != nil {
					// Treated as held: what is published stays.
					log.Error("a published root bundle does not parse; its trust domain's SPIFFE bundle stays as it is", "virtual_mesh", req.GetVirtualMesh(), "error", err)
				}
				m.Roots = roots
			}
			out = append(out, m)
		}
	}
	return out
}

// slogWriter sends the http.Server's own log (TLS handshake errors of
// clients) to the debug log: the endpoint is public, its clients' errors
// are theirs.
type slogWriter struct{ log *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.log.Debug(strings.TrimSpace(string(p)))
	return len(p), nil
}
