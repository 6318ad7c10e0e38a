package app

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"github.com/relaymesh/relaymesh/ca"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/relaymesh/relaymesh/dashboard"
	"github.com/relaymesh/relaymesh/internal/kubeauth"
	"github.com/relaymesh/relaymesh/internal/opshttp"
	"github.com/relaymesh/relaymesh/policy/admission"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/translation/controller"
	"github.com/relaymesh/relaymesh/trust"
	authorizationv1 "k8s.io/api/authorization/v1"
)

// newTranslation builds admission (the same OPA decision for the webhook
// and, before translation, for every stored object), the translation
// controller and the trust controller, and the in-process agents of
// kubeconfig-mode clusters.
func (p *process) newTranslation(ctx context.Context) error {
	var err error
	if p.admitter, err = admission.New(admission.Config{Recorder: p.audit, Registerer: p.reg, Logger: p.log}); err != nil {
		return err
	}
	if p.loader, err = admission.NewLoader(admission.LoaderConfig{Client: p.kube.Typed, Namespace: p.cfg.Namespace, Engine: p.admitter, Logger: p.log}); err != nil {
		return err
	}
	if err := p.loader.Start(ctx); err != nil {
		return err
	}
	acked := acksFrom(p.reps.several, p.view, p.status)
	ctlCfg := controller.Config{Client: p.kube.Dynamic, Informers: p.informers, Namespace: p.cfg.Namespace, Outputs: p.outputs, Logger: p.log, Acks: acked,
		Leading: p.reps.leading, Admission: p.admitter, Clusters: p.clusterNames}
	if p.sharedSnaps != nil {
		ctlCfg.Workloads = p.sharedSnaps
	}
	if p.ctl, err = controller.Start(ctx, ctlCfg); err != nil {
		return err
	}
	p.trust, err = trust.Start(ctx, trust.Config{Dynamic: p.kube.Dynamic, ClusterStatus: p.statusWrites, Informers: p.informers, Kube: p.kube.Typed, Namespace: p.cfg.Namespace, Outputs: p.outputs,
		Acks: acked, Leading: p.reps.leading, Clusters: p.clusterNames, Audit: p.audit, Logger: p.log,
		PKCS11Modules: p.cfg.PKCS11Modules, Registerer: p.reg, ReservedSecrets: p.cfg.reservedSecrets(),
		FederationWait: p.cfg.SPIFFEBundle.FederationWait(), RootPublished: p.rootPublished, ReservedTrustDomains: []string{p.td.Name()}})
	if err != nil {
		return err
	}
	// Foreign SPIFFE bundles: fetched by the Lease holder (spiffe-import).
	if p.importer, err = trust.NewImporter(trust.ImporterConfig{Dynamic: p.kube.Dynamic, Namespace: p.cfg.Namespace,
		Audit: p.audit, Log: p.log, Registerer: p.reg, Reserved: []string{p.td.Name()}}); err != nil {
		return err
	}
	for _, r := range p.sources() {
		r.OnRegister(func(string) { p.ctl.Kick(); p.trust.Kick() })
		r.OnRevoke(func(string) { p.ctl.Kick(); p.trust.Kick() })
	}
	p.outputs.MarkReady()
	if p.kubeconfigClusters != nil {
		p.inProcess = server.NewInProcessAgents(p.kube.Typed, p.cfg.Namespace, p.kubeconfigClusters, p.view, p.outputs, p.log)
	}
	return nil
}

// newRelayServer builds the relay: the identity service and the sessions,
// and this replica's heartbeat.
func (p *process) newRelayServer(ctx context.Context) error {
	metrics, err := server.NewMetrics(p.reg)
	if err != nil {
		return err
	}
	// Only the generated relay CA has a root the server rotates.
	var bundles server.TrustBundleSource
	if r, ok := p.signer.(*ca.RelayIssuers); ok {
		tb := newTrustBundles(r, p.kube.Dynamic, p.cfg.Namespace, p.log)
		go tb.run(ctx)
		bundles = tb
	}
	p.srv, err = server.NewServer(server.ServerConfig{
		TrustDomain:       p.td,
		Issuer:            p.authority,
		Tokens:            p.tokens,
		SharedToken:       p.sharedToken,
		Registry:          p.registry,
		ServerCertificate: p.serving.Certificate,
		Status:            sessionSink(p.reps.several, p.status, p.view, p.mirror),
		Audit:             p.audit,
		Logger:            p.log,
		Metrics:           metrics,
		DataPath:          &server.DataPathConfig{View: p.view, Outputs: p.outputs},
		Trust:             p.trust,
		Connections:       p.cfg.streamLimits(),
		Clusters:          p.cfg.Clusters,
		TrustBundles:      bundles,
	})
	if err != nil {
		return err
	}
	p.heartbeat(ctx)
	return nil
}

// newListeners binds the relay and the ops ports.
func (p *process) newListeners(context.Context) error {
	var err error
	if p.relayLis, err = net.Listen("tcp", p.cfg.Listen); err != nil {
		return err
	}
	p.closers = append(p.closers, func() { _ = p.relayLis.Close() })
	if p.metricsLis, err = net.Listen("tcp", p.cfg.MetricsListen); err != nil {
		return err
	}
	p.addrs.Relay, p.addrs.Metrics = p.relayLis.Addr().String(), p.metricsLis.Addr().String()
	return nil
}

// newOps serves /metrics, /healthz, /readyz and /debug on the metrics
// port, and the dashboard if asked.
func (p *process) newOps(ctx context.Context) error {
	mux := opshttp.Mux(p.reg, func() error {
		if p.srv.Isolated() {
			return fmt.Errorf("cut off from %s: not serving agents", strings.Join(p.srv.CutOff(), " and "))
		}
		return nil
	})
	if err := p.debugEndpoints(mux); err != nil {
		return err
	}
	if p.deps.Dashboard != nil {
		stop, err := p.deps.Dashboard(ctx, DashboardParts{View: p.view, Signer: p.signer, Serving: p.serving, AuditLog: p.audit,
			Shared: p.sharedSnaps, Authority: p.authority, Registry: p.reg})
		if err != nil {
			return err
		}
		p.closers = append(p.closers, stop)
	}
	httpSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	certificate, err := p.metricsCertificate(ctx)
	if err != nil {
		return err
	}
	if certificate == nil {
		go func() { _ = httpSrv.Serve(p.metricsLis) }()
	} else {
		httpSrv.TLSConfig = dashboard.ServerTLS(certificate)
		go func() { _ = httpSrv.ServeTLS(p.metricsLis, "", "") }()
	}
	p.closers = append(p.closers, func() { _ = httpSrv.Close() })
	return nil
}

// metricsCertificate is what the metrics port is served with: provided
// files (reloaded when they change), a certificate from the relay CA
// (renewed until ctx ends), or nil: plain HTTP (WEAKER, loopback only,
// the bound address checked too).
func (p *process) metricsCertificate(ctx context.Context) (func() (*tls.Certificate, error), error) {
	m := p.cfg.MetricsTLS
	switch {
	case m.PlainHTTP:
		bound, _ := p.metricsLis.Addr().(*net.TCPAddr)
		if bound == nil || !bound.IP.IsLoopback() {
			return nil, fmt.Errorf("--metrics-plain-http: %s is not a loopback address; off loopback the metrics port needs TLS", p.metricsLis.Addr())
		}
		p.log.Warn("metrics port served over plain HTTP (--metrics-plain-http, WEAKER): loopback only; /debug bearer tokens and metrics travel unencrypted on this host", "address", p.addrs.Metrics)
		return nil, nil
	case m.CertFile != "":
		files, err := dashboard.LoadCertificateFiles(m.CertFile, m.KeyFile, time.Now, p.log.With("for", "metrics-port"))
		if err != nil {
			return nil, fmt.Errorf("--metrics-tls-cert: %w", err)
		}
		p.log.Info("metrics port listening over TLS", "address", p.addrs.Metrics, "certificate", "files")
		return files.Certificate, nil
	}
	names, ips, err := p.cfg.metricsNames()
	if err != nil {
		return nil, err
	}
	cert, err := server.NewServingCert(ctx, p.authority, names, ips, nil, p.log.With("for", "metrics-port"))
	if err != nil {
		return nil, fmt.Errorf("the metrics port's certificate: %w", err)
	}
	go cert.Run(ctx)
	p.log.Info("metrics port listening over TLS", "address", p.addrs.Metrics, "certificate", "relay-ca")
	return cert.Certificate, nil
}

// debugEndpoints adds /debug/* to mux: authenticated by TokenReview and
// authorized by SubjectAccessReview (debugAttributes), or off.
func (p *process) debugEndpoints(mux *http.ServeMux) error {
	if p.cfg.DebugEndpoints != DebugAuthenticated {
		p.log.Info("debug endpoints are off (--debug-endpoints off)")
		return nil
	}
	auth, err := kubeauth.New(kubeauth.Config{Client: p.kube.Typed, Logger: p.log})
	if err != nil {
		return err
	}
	for name, value := range map[string]func() any{
		"snapshots/input":  func() any { return p.view.Clusters() },
		"snapshots/output": func() any { return p.outputs.All() },
		"admission":        func() any { return p.loader.Status() },
	} {
		mux.Handle("/debug/"+name, auth.Handler(debugAttributes(p.cfg.Namespace), jsonHandler(value)))
	}
	return nil
}

// serve serves agents until ctx ends (nil) or serving fails.
func (p *process) serve(ctx context.Context) error {
	p.log.Info("relay server listening", "relay", p.addrs.Relay, "metrics", p.addrs.Metrics, "trust_domain", p.td.String(),
		"registered_clusters", len(p.registry.Names()), "shared_token_mode", p.cfg.AllowSharedToken)
	errc := make(chan error, 1)
	go func() { errc <- p.srv.Serve(p.relayLis) }()
	if p.deps.Listening != nil {
		p.deps.Listening(p.addrs)
	}
	select {
	case <-ctx.Done():
		p.log.Info("shutting down")
		p.srv.Stop()
		return nil
	case err := <-errc:
		return err
	}
}

// debugAttributes is what a request for /debug/<name> must be allowed:
// get on relaymesh.io/debug named after the endpoint ("snapshots-input",
// "snapshots-output", "admission") in the server's namespace. Grant it with
// a Role: apiGroups [relaymesh.io], resources [debug], verbs [get].
func debugAttributes(namespace string) kubeauth.Attributes {
	return func(r *http.Request) *authorizationv1.ResourceAttributes {
		name := strings.ReplaceAll(strings.TrimPrefix(r.URL.Path, "/debug/"), "/", "-")
		return &authorizationv1.ResourceAttributes{Namespace: namespace, Verb: "get", Group: "relaymesh.io", Resource: "debug", Name: name}
	}
}

// jsonHandler serves f's value as indented JSON. The values served hold
// discovery data and output manifests, never a secret.
func jsonHandler(f func() any) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(f())
	}
}
