package app

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

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
	acks := acksFrom(p.reps.several, p.view, p.status)
	ctlCfg := controller.Config{Client: p.kube.Dynamic, Namespace: p.cfg.Namespace, Outputs: p.outputs, Logger: p.log, Acks: acks,
		Leading: p.reps.leading, Admission: p.admitter, Clusters: p.clusterNames}
	if p.sharedSnaps != nil {
		ctlCfg.Workloads = p.sharedSnaps
	}
	if p.ctl, err = controller.Start(ctx, ctlCfg); err != nil {
		return err
	}
	p.trust, err = trust.Start(ctx, trust.Config{Dynamic: p.kube.Dynamic, Kube: p.kube.Typed, Namespace: p.cfg.Namespace, Outputs: p.outputs,
		Acks: acks, Leading: p.reps.leading, Clusters: p.clusterNames, Audit: p.audit, Logger: p.log,
		PKCS11Modules: p.cfg.PKCS11Modules, Registerer: p.reg, ReservedSecrets: p.cfg.reservedSecrets()})
	if err != nil {
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
	httpSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = httpSrv.Serve(p.metricsLis) }()
	p.closers = append(p.closers, func() { _ = httpSrv.Close() })
	return nil
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
