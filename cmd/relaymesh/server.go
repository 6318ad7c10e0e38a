package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/internal/kubeauth"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/kubeutil"
	"github.com/relaymesh/relaymesh/internal/lease"
	"github.com/relaymesh/relaymesh/internal/logging"
	"github.com/relaymesh/relaymesh/internal/opshttp"
	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/relaymesh/relaymesh/policy/admission"
	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/heads"
	"github.com/relaymesh/relaymesh/server/leader"
	"github.com/relaymesh/relaymesh/translation/controller"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const serverSynopsis = `Runs the management server in the management cluster: the relay CA, the
identity service agents bootstrap and renew with, and their sessions.

On first start it generates the relay root and issuing CA into the secrets
relay-root-tls-secret and relay-tls-signing-secret of --namespace (or uses a
provided CA: --ca-cert/--ca-key/--ca-roots). Every token use, issuance,
renewal, denial, revocation and admission decision goes to --audit-log.

Admission: every VirtualMesh, TrafficPolicy, AccessPolicy and
VirtualDestination is judged by the built-in OPA rules and the rule sets in
ConfigMaps labelled relaymesh.io/admission-policy in --namespace (reloaded
on change). With --webhook-listen and --webhook-url or --webhook-service the
server also registers a ValidatingWebhookConfiguration so kubectl is told at
once; without it, refused objects are created but marked Invalid and never
translated.`

type serverFlags struct {
	namespace, listen, metricsListen, trustDomain     string
	dnsNames, ips, auditLog, logLevel                 string
	caCert, caKey, caRoots, caSecret                  string
	agentTTL                                          time.Duration
	allowSharedToken, allowKubeconfig                 bool
	webhookListen, webhookURL, webhookService         string
	webhookDNSNames, webhookIPs, webhookFailurePolicy string
	webhookClientCA, debugEndpoints                   string
	webhookAllowUnauthenticated                       bool
	dash                                              dashboardServeFlags
	pkcs11Modules                                     []string
	kubeQPS                                           float64
	replicaName                                       string
	leaderElect                                       bool
	leaseDuration, renewDeadline, retryPeriod         time.Duration
	conns                                             relay.ConnectionLimits
	clusters                                          relay.ClusterLimits
	store                                             snapshotStoreFlags
}

func newServerCommand(d deps, g *globals) *cobra.Command {
	var f serverFlags
	c := &cobra.Command{
		Use:   "server",
		Short: "Run the management server (relay gRPC :9900, metrics/health/debug :9091)",
		Long:  serverSynopsis,
		Example: `  # In the management cluster (the chart runs this); the relay CA is generated at first start
  relaymesh server --audit-log /var/log/relaymesh/audit.log

  # On a workstation against a management cluster context, with the admission webhook
  relaymesh server --context mgmt --audit-log audit.log --webhook-listen :9443 \
    --webhook-url https://relaymesh.example.com:9443/validate --webhook-client-ca apiserver-webhook-client-ca.pem`,
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			f.namespace = g.namespace
			if err := f.validate(); err != nil {
				return usageError{err}
			}
			src, err := g.source()
			if err != nil {
				return err
			}
			src.QPS, src.Burst = float32(f.kubeQPS), int(2*f.kubeQPS)
			kube, err := src.Load()
			if err != nil {
				return err
			}
			return runServer(c.Context(), f, kube, d)
		},
	}
	fs := c.Flags()
	fs.StringVar(&f.listen, "listen", ":9900", "relay gRPC address")
	fs.StringVar(&f.metricsListen, "metrics-listen", ":9091", "metrics and health address (/metrics, /healthz, /readyz)")
	fs.StringVar(&f.trustDomain, "trust-domain", "relaymesh.local", "SPIFFE trust domain of agent identities")
	fs.StringVar(&f.dnsNames, "server-dns-names", "localhost,relaymesh-server,relaymesh-server.relaymesh.svc", "comma-separated DNS names in the server certificate (agents verify one of them)")
	fs.StringVar(&f.ips, "server-ips", "127.0.0.1", "comma-separated IP addresses in the server certificate")
	fs.StringVar(&f.auditLog, "audit-log", "", "path of the hash-chained audit log (required)")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.caCert, "ca-cert", "", "provided relay CA: PEM of the issuing CA certificate (then intermediates)")
	fs.StringVar(&f.caKey, "ca-key", "", "provided relay CA: PEM of its private key")
	fs.StringVar(&f.caRoots, "ca-roots", "", "provided relay CA: PEM of the root(s) it chains to")
	fs.StringVar(&f.caSecret, "ca-secret", "", "provided relay CA from a Secret in --namespace (keys tls.crt, tls.key, ca.crt)")
	fs.DurationVar(&f.agentTTL, "agent-cert-ttl", 24*time.Hour, "lifetime of agent client certificates (renewed at about 2/3)")
	fs.BoolVar(&f.allowSharedToken, "allow-shared-token", false, "WEAKER: also accept the shared token of relay-identity-token-secret (seed-product compatibility)")
	fs.StringVar(&f.webhookListen, "webhook-listen", "", "serve the admission webhook (HTTPS) on this address, e.g. :9443; empty: no webhook, only the in-process check before translation")
	fs.StringVar(&f.webhookURL, "webhook-url", "", "URL the kube-apiserver calls the webhook at (https://…/validate); or --webhook-service")
	fs.StringVar(&f.webhookService, "webhook-service", "", "Service the kube-apiserver calls the webhook through, NAMESPACE/NAME[:PORT]; or --webhook-url")
	fs.StringVar(&f.webhookDNSNames, "webhook-dns-names", "", "comma-separated DNS names of the webhook's certificate (default: the URL's host, or the Service's names)")
	fs.StringVar(&f.webhookIPs, "webhook-ips", "", "comma-separated IPs of the webhook's certificate (default: the URL's host if it is an IP)")
	fs.StringVar(&f.webhookFailurePolicy, "webhook-failure-policy", "Fail", "Fail (an unreachable webhook blocks changes) or WEAKER Ignore (changes pass while it is down; the in-process check still marks refused objects Invalid)")
	fs.StringArrayVar(&f.pkcs11Modules, "pkcs11-module", nil, "a PKCS#11 module a VirtualMesh's spec.mtls.shared.rootCA.pkcs11.modulePath may name (repeatable; none: pkcs11 roots are refused, so a VirtualMesh cannot make the server load an arbitrary library)")
	fs.BoolVar(&f.allowKubeconfig, "allow-kubeconfig-clusters", false, "WEAKER: manage clusters registered in kubeconfig mode, with the kubeconfig in their Secret (the server then holds their credentials)")
	fs.Float64Var(&f.kubeQPS, "kube-qps", 200, "requests per second the server's Kubernetes client may send to the management apiserver (burst twice that); size it for the fleet, with the apiserver's API Priority and Fairness in mind")
	fs.IntVar(&f.conns.MaxConnections, "max-connections", 32768, "relay connections open at once, all peers")
	fs.IntVar(&f.conns.MaxConnectionsPerAddress, "max-connections-per-address", 256, "relay connections open at once from one address (IPv6: /64); agents behind one NAT share it")
	fs.IntVar(&f.conns.MaxPreAuth, "max-preauth-connections", 1024, "relay connections open at once that have not authenticated (handshaking or bootstrapping)")
	fs.IntVar(&f.conns.MaxPreAuthPerAddress, "max-preauth-connections-per-address", 16, "unauthenticated relay connections open at once from one address")
	fs.Float64Var(&f.clusters.RenewsPerMinute, "cluster-renewals-per-minute", 6, "certificate renewals a cluster may ask for per minute (burst 10)")
	fs.IntVar(&f.clusters.MaxSessions, "cluster-max-streams", 32, "relay streams (sessions, snapshots, outputs) one cluster may hold open at once")
	fs.Float64Var(&f.conns.StreamsPerSecond, "connection-streams-per-second", 50, "streams an authenticated relay connection may open per second (burst 4x); beyond, the connection is closed (what an HTTP/2 rapid-reset flood meets); raise it with --cluster-renewals-per-minute")
	fs.StringVar(&f.debugEndpoints, "debug-endpoints", "authenticated", "authenticated: /debug/* on the metrics port answers only bearer tokens the apiserver accepts (TokenReview) whose user may get relaymesh.io/debug (SubjectAccessReview); off: not served")
	fs.StringVar(&f.webhookClientCA, "webhook-client-ca", "", "PEM file of the CA that issued the kube-apiserver's client certificate for admission webhooks (its --admission-control-config-file kubeconfig): the webhook then answers only callers with such a certificate; required with --webhook-listen unless --webhook-allow-unauthenticated")
	f.dash.register(fs)
	fs.BoolVar(&f.webhookAllowUnauthenticated, "webhook-allow-unauthenticated", false, "WEAKER: serve the webhook to callers without a client certificate; decisions record the caller as unauthenticated and each source address has its own budget")
	fs.StringVar(&f.replicaName, "replica-name", "", "this replica's name in the server's Leases and in KubernetesCluster status (unique per replica; default: $POD_NAME, else the host name and process ID)")
	fs.BoolVar(&f.leaderElect, "leader-elect", true, "run as one of several replicas: the once-only work (output heads, statuses, the rotation driver, orphan collection, the session sweep, the token-mint audit, the webhook's configuration, the in-process agents of kubeconfig-mode clusters) runs only while holding the Lease relaymesh-server in --namespace; off: this process does it unconditionally and serves its own output versions (run exactly one replica)")
	fs.DurationVar(&f.leaseDuration, "leader-lease-duration", 8*time.Second, "how long the server's Lease lasts without renewal (another replica takes over after it)")
	fs.DurationVar(&f.renewDeadline, "leader-renew-deadline", 5*time.Second, "how long the leading replica retries renewing before it stops its once-only work")
	fs.DurationVar(&f.retryPeriod, "leader-retry-period", time.Second, "how often replicas try to acquire or renew the Lease")
	f.store.register(fs)
	for name, values := range map[string][]string{"log-level": {"debug", "info", "warn", "error"}, "webhook-failure-policy": {"Fail", "Ignore"}, "debug-endpoints": {"authenticated", "off"},
		"snapshot-store": {snapshotStoreAPIServer, snapshotStoreRedis}} {
		_ = c.RegisterFlagCompletionFunc(name, cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp))
	}
	return c
}

func runServer(ctx context.Context, f serverFlags, kube *kubeclient.Clients, d deps) error {
	stderr := d.stderr
	log, err := newLogger(stderr, f.logLevel)
	if err != nil {
		return err
	}
	log = log.With("component", "server")
	td, err := spiffeid.TrustDomainFromString(f.trustDomain)
	if err != nil {
		return usageError{fmt.Errorf("--trust-domain: %w", err)}
	}
	var ips []net.IP
	for _, s := range splitList(f.ips) {
		ip := net.ParseIP(s)
		if ip == nil {
			return usagef("--server-ips: %q is not an IP address", text.Truncate(s, 80))
		}
		ips = append(ips, ip)
	}

	if _, err := kube.Typed.CoreV1().Namespaces().Get(ctx, f.namespace, metav1.GetOptions{}); err != nil {
		return fmt.Errorf("namespace %s: %w", f.namespace, err)
	}
	auditLog, err := audit.Open(audit.Config{Path: f.auditLog, Sync: true})
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	defer auditLog.Close()

	signer, err := f.signer(ctx, kube)
	if err != nil {
		return err
	}
	authority, err := ca.New(ca.Config{Signer: signer, AgentTTL: f.agentTTL})
	if err != nil {
		return err
	}
	// relay-server-tls-secret has one writer: this process, or with several
	// replicas the Lease holder (below).
	var storeServing func(context.Context, []byte, []byte) error
	if !f.leaderElect {
		storeServing = storeServingSecret(kube, f.namespace)
	}
	serving, err := server.NewServingCert(ctx, authority, splitList(f.dnsNames), ips, storeServing, log)
	if err != nil {
		return err
	}
	store, err := identity.NewKubeTokenStore(kube.Typed, f.namespace)
	if err != nil {
		return err
	}
	// Token records come from a watch: a bootstrap is one API call.
	if err := store.WatchCache(ctx); err != nil {
		return err
	}
	tokens, err := identity.NewTokens(identity.TokensConfig{Store: store})
	if err != nil {
		return err
	}
	var shared *identity.SharedToken
	if f.allowSharedToken {
		sec, err := kube.Typed.CoreV1().Secrets(f.namespace).Get(ctx, identity.TokenSecret, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("--allow-shared-token: secret %s/%s: %w", f.namespace, identity.TokenSecret, err)
		}
		if shared, err = identity.NewSharedToken(string(sec.Data[identity.KeyToken])); err != nil {
			return fmt.Errorf("--allow-shared-token: %w", err)
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfo())
	metrics, err := server.NewMetrics(reg)
	if err != nil {
		return err
	}
	registry := server.NewRegistry()
	var kubeconfigClusters *server.Registry
	if f.allowKubeconfig {
		kubeconfigClusters = server.NewRegistry()
		log.Warn("kubeconfig-mode clusters are allowed: the server will hold credentials for every cluster registered that way; relay mode is the secure choice")
	}
	if err := server.WatchClusters(ctx, kube.Dynamic, f.namespace, registry, kubeconfigClusters, log); err != nil {
		return err
	}
	// Work that must happen once across the replicas runs under the Lease.
	reps, err := f.onceOnlyWork(kube, reg, log)
	if err != nil {
		return err
	}
	onceOnly := reps.add
	// One audit record per minted token, not one per replica.
	onceOnly(lease.Task{Name: "token-mint-audit", Run: func(ctx context.Context) {
		if err := identity.AuditTokenMints(ctx, kube.Typed, f.namespace, auditLog, log); err != nil && ctx.Err() == nil {
			log.Error("cannot watch bootstrap tokens: their minting is not audited", "error", err)
		}
		<-ctx.Done()
	}})
	// With leader election this is one of several replicas: state they
	// share goes through the apiserver.
	ha := reps.name != ""
	status := server.NewKubeStatus(kube.Dynamic, f.namespace, log, server.StatusConfig{Replica: reps.name})
	if ha {
		onceOnly(lease.Task{Name: "session-sweep", Run: func(ctx context.Context) {
			status.Sweep(ctx, replicaHeartbeat, func(ctx context.Context) (map[string]bool, error) { return leader.Alive(ctx, reps.coord, f.namespace) })
		}})
		// Pods get new names on every rollout: the Leases of replicas gone
		// for long are deleted, so they do not pile up.
		onceOnly(lease.Task{Name: "replica-lease-collection", Run: func(ctx context.Context) {
			for {
				if gone, err := leader.CollectGone(ctx, reps.coord, f.namespace, time.Now()); err != nil && ctx.Err() == nil {
					log.Warn("could not delete the Leases of gone replicas", "error", err)
				} else if len(gone) > 0 {
					log.Info("deleted the Leases of replicas gone for long", "leases", gone, "gone_for", leader.GoneAfter)
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Minute):
				}
			}
		}})
	}
	if ha {
		serving.SetStore(storeServingSecret(kube, f.namespace), reps.leading)
		onceOnly(lease.Task{Name: "serving-secret", Run: func(ctx context.Context) {
			if err := serving.Publish(ctx); err != nil && ctx.Err() == nil {
				log.Warn("could not store the serving certificate's secret", "error", err)
			}
			<-ctx.Done()
		}})
	}
	registry.OnRevoke(status.Forget)
	go status.Run(ctx)
	go serving.Run(ctx)

	// The data path: snapshots become discovered objects; outputs (today
	// pass-through objects, later translation) go to the agents.
	view := server.NewView()
	// Acks go to the cluster's status, where the replica holding the Lease
	// reads every cluster's, whichever replica the agent talks to.
	view.OnAck(func(c string) { status.Acked(c, view.Ack(c)) })
	workloadsIn := multiclusterv1alpha1.WorkloadsInAPIServer
	if f.store.kind == snapshotStoreRedis {
		workloadsIn = multiclusterv1alpha1.WorkloadsInRedis
	}
	view.OnSnapshot(func(c string) {
		if snap := view.Snapshot(c); snap != nil {
			status.Discovered(c, server.Summarize(snap, workloadsIn))
		}
	})
	var acks interface {
		Ack(cluster string) *relaypb.PullAck
		OnAck(func(cluster string))
	} = view
	if ha {
		acks = status
	}
	mirrorCfg := server.MirrorConfig{Registerer: reg, WorkloadsElsewhere: f.store.kind == snapshotStoreRedis}
	var sink server.StatusSink = status
	if ha {
		// The replica holding a cluster's session writes its objects; the
		// leader deletes those of clusters that left. A replica whose
		// agent moved on forgets the snapshot, so it never writes a stale
		// one over the new holder's.
		mirrorCfg.Owns = func(c string) bool {
			if view.Has(c) {
				return true
			}
			_, relayMode := registry.Lookup(c)
			_, kubeconfigMode := kubeconfigClusters.Lookup(c)
			return !relayMode && !kubeconfigMode && reps.leading()
		}
	}
	mirror := server.NewMirrorWithConfig(kube.Dynamic, f.namespace, view, log, mirrorCfg)
	if ha {
		sink = releasingSink{KubeStatus: status, view: view, mirror: mirror}
	}
	registry.OnRevoke(mirror.Kick)
	go mirror.Run(ctx)
	registered := func(c string) bool {
		if _, ok := registry.Lookup(c); ok {
			return true
		}
		_, ok := kubeconfigClusters.Lookup(c)
		return ok
	}
	sharedSnaps, err := f.startSharedSnapshots(ctx, kube, view, ha, reps.name, registered, reg, log)
	if err != nil {
		return err
	}
	if sharedSnaps != nil {
		onceOnly(lease.Task{Name: "snapshot-store-collection", Run: func(ctx context.Context) { collectSharedSnapshots(ctx, sharedSnaps, registry, log) }})
	}
	onceOnly(lease.Task{Name: "orphan-collection", Run: func(ctx context.Context) {
		if err := mirror.CollectOrphans(ctx, registered); err != nil {
			log.Warn("could not delete discovered objects of unregistered clusters", "error", err)
		}
	}})
	outputs := server.NewOutputs(time.Now())
	var afterAdopt []func() // run when a term's leader adopted the heads
	if ha {
		// Replicas serve one order of versions: the leader's heads.
		headStore := heads.New(reps.coord, f.namespace, log)
		headStore.OnChange(outputs.HeadChanged)
		if err := headStore.Start(ctx); err != nil {
			return err
		}
		outputs.UseHeads(headStore.Head)
		writer := heads.NewWriter(headStore, outputs, log)
		writer.Adopted = func() {
			for _, f := range afterAdopt {
				f()
			}
		}
		outputs.OnPublish(writer.Dirty)
		onceOnly(lease.Task{Name: "output-heads", Run: writer.Lead})
	}
	sources := []*server.Registry{registry}
	if kubeconfigClusters != nil {
		sources = append(sources, kubeconfigClusters)
	}
	if _, err := server.RunPassthrough(ctx, kube.Dynamic, f.namespace, outputs, log, sources...); err != nil {
		return err
	}
	// Admission: the same OPA decision for the webhook and, before
	// translation, for every stored object.
	admitter, err := admission.New(admission.Config{Recorder: auditLog, Registerer: reg, Logger: log})
	if err != nil {
		return err
	}
	loader, err := admission.NewLoader(admission.LoaderConfig{Client: kube.Typed, Namespace: f.namespace, Engine: admitter, Logger: log})
	if err != nil {
		return err
	}
	if err := loader.Start(ctx); err != nil {
		return err
	}
	ctlCfg := controller.Config{Client: kube.Dynamic, Namespace: f.namespace, Outputs: outputs, Logger: log, Acks: acks, Leading: reps.leading,
		Admission: admitter, Clusters: func() []string { return append(registry.Names(), kubeconfigClusters.Names()...) }}
	if sharedSnaps != nil {
		ctlCfg.Workloads = sharedSnaps
	}
	ctl, err := controller.Start(ctx, ctlCfg)
	if err != nil {
		return err
	}
	trustCtl, err := trust.Start(ctx, trust.Config{Dynamic: kube.Dynamic, Kube: kube.Typed, Namespace: f.namespace, Outputs: outputs, Acks: acks, Leading: reps.leading,
		Clusters: func() []string { return append(registry.Names(), kubeconfigClusters.Names()...) }, Audit: auditLog, Logger: log,
		PKCS11Modules: f.pkcs11Modules, Registerer: reg, ReservedSecrets: f.reservedSecrets()})
	if err != nil {
		return err
	}
	afterAdopt = append(afterAdopt, ctl.Kick, trustCtl.Kick)
	onceOnly(lease.Task{Name: "status-and-rotation", Run: func(ctx context.Context) {
		// Without heads (--leader-elect=false) nothing else starts a term's
		// statuses; at a term's end, a follower re-reads what it follows.
		ctl.Kick()
		trustCtl.Kick()
		<-ctx.Done()
		ctl.Kick()
		trustCtl.Kick()
	}})
	for _, r := range sources {
		r.OnRegister(func(string) { ctl.Kick(); trustCtl.Kick() })
		r.OnRevoke(func(string) { ctl.Kick(); trustCtl.Kick() })
	}
	outputs.MarkReady()
	if kubeconfigClusters != nil {
		// One replica at a time discovers and applies to a kubeconfig-mode
		// cluster; at the end of its term the next leader's mirror takes
		// the clusters' discovered objects over.
		inProcess := server.NewInProcessAgents(kube.Typed, f.namespace, kubeconfigClusters, view, outputs, log)
		onceOnly(lease.Task{Name: "kubeconfig-clusters", Run: func(ctx context.Context) {
			for _, cluster := range inProcess.Run(ctx) {
				mirror.Kick(cluster)
			}
		}})
	}

	srv, err := server.NewServer(server.ServerConfig{
		TrustDomain:       td,
		Issuer:            authority,
		Tokens:            tokens,
		SharedToken:       shared,
		Registry:          registry,
		ServerCertificate: serving.Certificate,
		Status:            sink,
		Audit:             auditLog,
		Logger:            log,
		Metrics:           metrics,
		DataPath:          &server.DataPathConfig{View: view, Outputs: outputs},
		Trust:             trustCtl,
		Connections:       f.connections(),
		Clusters:          f.clusters,
	})
	if err != nil {
		return err
	}
	if ha {
		// A replica cut off from the apiserver cannot learn of
		// deregistrations: it fails closed and its agents move on. As it
		// stops, it deletes its Lease: waiting for that lets the leader
		// sweep its sessions at once.
		hb := leader.HeartbeatConfig{Client: reps.coord, Namespace: f.namespace, Replica: reps.name, Period: replicaHeartbeat, Logger: log, Isolated: srv.SetIsolated}
		if sharedSnaps != nil {
			hb.Store = func() string { return storeState(sharedSnaps) }
			go sharedSnaps.Guard(ctx, storeCutGrace, storeDetect, func(ctx context.Context) (time.Time, error) {
				return othersReachStore(ctx, reps, f.namespace)
			}, func(cut bool) {
				srv.SetCutOff(server.CutOffSnapshotStore, cut)
				reps.abstain(cut)
			})
		}
		heartbeatDone := make(chan struct{})
		go func() {
			leader.Heartbeat(ctx, hb)
			close(heartbeatDone)
		}()
		defer func() {
			select {
			case <-heartbeatDone:
			case <-time.After(3 * time.Second):
			}
		}()
	}
	lis, err := net.Listen("tcp", f.listen)
	if err != nil {
		return err
	}
	mlis, err := net.Listen("tcp", f.metricsListen)
	if err != nil {
		return err
	}
	if f.webhookListen != "" {
		stop, err := f.serveWebhook(ctx, kube, authority, admitter, log, onceOnly)
		if err != nil {
			return err
		}
		defer stop()
		reg.MustRegister(webhookInfo(f.webhookClientCA != "", f.webhookFailurePolicy))
	} else {
		log.Warn("no admission webhook (--webhook-listen): objects the rules refuse can be created, and are marked Invalid and not translated")
	}
	mux := opshttp.Mux(reg, func() error {
		if srv.Isolated() {
			return fmt.Errorf("cut off from %s: not serving agents", strings.Join(srv.CutOff(), " and "))
		}
		return nil
	})
	if f.debugEndpoints == "authenticated" {
		auth, err := kubeauth.New(kubeauth.Config{Client: kube.Typed, Logger: log})
		if err != nil {
			return err
		}
		for name, value := range map[string]func() any{
			"snapshots/input":  func() any { return view.Clusters() },
			"snapshots/output": func() any { return outputs.All() },
			"admission":        func() any { return loader.Status() },
		} {
			mux.Handle("/debug/"+name, auth.Handler(debugAttributes(f.namespace), jsonHandler(value)))
		}
	} else {
		log.Info("debug endpoints are off (--debug-endpoints off)")
	}
	if f.dash.listen != "" {
		stop, err := serveDashboard(ctx, f, kube, dashboardParts{view: view, pki: signer, serving: serving, auditLog: auditLog, shared: sharedSnaps, authority: authority, reg: reg}, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	httpSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = httpSrv.Serve(mlis) }()
	defer httpSrv.Close()

	// The once-only work stops with ctx; waiting for it lets the elector
	// release the Lease, so another replica takes over at once instead of
	// after the lease duration.
	onceOnlyDone := make(chan struct{})
	go func() { reps.run(ctx); close(onceOnlyDone) }()
	defer func() {
		select {
		case <-onceOnlyDone:
		case <-time.After(f.renewDeadline):
			log.Warn("once-only work did not stop in time; the Lease expires on its own")
		}
	}()
	log.Info("relay server listening", "relay", lis.Addr().String(), "metrics", mlis.Addr().String(), "trust_domain", td.String(),
		"registered_clusters", len(registry.Names()), "shared_token_mode", f.allowSharedToken)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case <-ctx.Done():
		log.Info("shutting down")
		srv.Stop()
		return nil
	case err := <-errc:
		return err
	}
}

func (f serverFlags) validate() error {
	var errs []error
	if _, err := logging.ParseLevel(f.logLevel); err != nil {
		errs = append(errs, fmt.Errorf("--log-level %q: want debug, info, warn or error", text.Truncate(f.logLevel, 40)))
	}
	if _, err := spiffeid.TrustDomainFromString(f.trustDomain); err != nil {
		errs = append(errs, fmt.Errorf("--trust-domain: %w", err))
	}
	if f.leaderElect && !(f.retryPeriod > 0 && f.retryPeriod < f.renewDeadline && f.renewDeadline < f.leaseDuration) {
		errs = append(errs, errors.New("leader election needs 0 < --leader-retry-period < --leader-renew-deadline < --leader-lease-duration"))
	}
	if f.replicaName != "" && len(validation.IsDNS1123Subdomain(f.replicaName)) > 0 {
		errs = append(errs, fmt.Errorf("--replica-name %q: must be a DNS subdomain (lowercase letters, digits, '-' and '.')", text.Truncate(f.replicaName, 80)))
	}
	if f.auditLog == "" {
		errs = append(errs, errors.New("--audit-log is required: every issuance and denial must be recorded"))
	}
	if f.namespace == "" {
		errs = append(errs, errors.New("--namespace must not be empty"))
	}
	if f.webhookListen == "" && (f.webhookURL != "" || f.webhookService != "") {
		errs = append(errs, errors.New("--webhook-url and --webhook-service need --webhook-listen"))
	}
	if f.webhookListen != "" {
		if _, err := f.webhookTarget(); err != nil {
			errs = append(errs, err)
		}
		if (f.webhookClientCA == "") == !f.webhookAllowUnauthenticated {
			errs = append(errs, errors.New("--webhook-listen needs --webhook-client-ca (the apiserver authenticates with its client certificate) or, WEAKER, --webhook-allow-unauthenticated, not both"))
		}
	}
	for name, v := range map[string]int{"--max-connections": f.conns.MaxConnections, "--max-connections-per-address": f.conns.MaxConnectionsPerAddress,
		"--max-preauth-connections": f.conns.MaxPreAuth, "--max-preauth-connections-per-address": f.conns.MaxPreAuthPerAddress, "--cluster-max-streams": f.clusters.MaxSessions} {
		if v < 1 {
			errs = append(errs, fmt.Errorf("%s must be at least 1", name))
		}
	}
	if f.kubeQPS <= 0 {
		errs = append(errs, errors.New("--kube-qps must be positive"))
	}
	if f.conns.StreamsPerSecond <= 0 {
		errs = append(errs, errors.New("--connection-streams-per-second must be positive"))
	}
	if f.clusters.RenewsPerMinute <= 0 {
		errs = append(errs, errors.New("--cluster-renewals-per-minute must be positive"))
	}
	switch f.debugEndpoints {
	case "authenticated", "off":
	default:
		errs = append(errs, fmt.Errorf("--debug-endpoints %q: use authenticated or off", f.debugEndpoints))
	}
	provided := 0
	for _, v := range []string{f.caCert, f.caKey, f.caRoots} {
		if v != "" {
			provided++
		}
	}
	if provided != 0 && provided != 3 {
		errs = append(errs, errors.New("--ca-cert, --ca-key and --ca-roots go together"))
	}
	if provided != 0 && f.caSecret != "" {
		errs = append(errs, errors.New("--ca-secret and --ca-cert/--ca-key/--ca-roots are alternatives"))
	}
	if len(splitList(f.dnsNames)) == 0 && len(splitList(f.ips)) == 0 {
		errs = append(errs, errors.New("--server-dns-names or --server-ips must name the server"))
	}
	errs = append(errs, f.store.validate()...)
	errs = append(errs, f.dash.validate()...)
	return errors.Join(errs...)
}

// signer is the provided CA if one was given, else the generated one. A
// provided CA's roots are published in relay-root-tls-secret (ca.crt only)
// for registration to copy to workload clusters.
func (f serverFlags) signer(ctx context.Context, kube *kubeclient.Clients) (ca.Signer, error) {
	var signer ca.Signer
	var err error
	switch {
	case f.caCert != "":
		signer, err = ca.LoadSignerFiles(f.caCert, f.caKey, f.caRoots, time.Now())
	case f.caSecret != "":
		var sec *corev1.Secret
		sec, err = kube.Typed.CoreV1().Secrets(f.namespace).Get(ctx, f.caSecret, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("--ca-secret: %w", err)
		}
		signer, err = ca.ParseSignerPEM(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey], sec.Data["ca.crt"], time.Now())
	default:
		return ca.LoadOrCreateRelayCA(ctx, kube.Typed, f.namespace, ca.GenerateConfig{})
	}
	if err != nil {
		return nil, fmt.Errorf("provided relay CA: %w", err)
	}
	return signer, publishRoots(ctx, kube, f.namespace, signer.Roots())
}

// publishRoots writes the provided CA's roots into relay-root-tls-secret. It
// refuses to overwrite a generated relay CA (a secret that holds a key).
func publishRoots(ctx context.Context, kube *kubeclient.Clients, namespace string, roots []*x509.Certificate) error {
	var rootsPEM []byte
	for _, r := range roots {
		rootsPEM = append(rootsPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.Raw})...)
	}
	cur, err := kube.Typed.CoreV1().Secrets(namespace).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
	if err == nil && len(cur.Data[corev1.TLSPrivateKeyKey]) > 0 {
		return fmt.Errorf("%s/%s holds a generated relay CA; delete it and %s to switch to a provided CA (agents must then be registered again)", namespace, ca.RootSecretName, ca.SigningSecretName)
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return kubeutil.UpsertSecret(ctx, kube.Typed, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: ca.RootSecretName, Namespace: namespace, Labels: map[string]string{"app.kubernetes.io/managed-by": "relaymesh"}},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{"ca.crt": rootsPEM},
	})
}

// storeServingSecret writes relay-server-tls-secret for operators and tools
// that expect it (the Lease holder's certificate, with several replicas);
// every replica serves its own from memory.
func storeServingSecret(kube *kubeclient.Clients, namespace string) func(ctx context.Context, certPEM, keyPEM []byte) error {
	return func(ctx context.Context, certPEM, keyPEM []byte) error {
		want := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "relay-server-tls-secret", Namespace: namespace, Labels: map[string]string{"app.kubernetes.io/managed-by": "relaymesh"}},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM},
		}
		return kubeutil.UpsertSecret(ctx, kube.Typed, want)
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

// reservedSecrets are the Secrets of --namespace no VirtualMesh may use as
// a root: a provided relay CA's (the generated relay CA's are always
// reserved).
func (f *serverFlags) reservedSecrets() []string {
	if f.caSecret == "" {
		return nil
	}
	return []string{f.caSecret}
}

// connections are the relay's connection limits, with the stream burst
// that goes with --connection-streams-per-second.
func (f serverFlags) connections() relay.ConnectionLimits {
	c := f.conns
	c.StreamBurst = int(min(4*c.StreamsPerSecond, 1<<20))
	return c
}

// replicas is how this process works beside other replicas of the server.
type replicas struct {
	// name of this replica ("" with --leader-elect=false: the only one).
	name string
	// add registers work that must run on one replica at a time; run runs
	// it (under the Lease, or unconditionally with --leader-elect=false).
	add func(lease.Task)
	run func(context.Context)
	// coord is the client of the Leases and heads (nil without leader
	// election).
	coord kubernetes.Interface
	// leading reports whether this replica runs the once-only work now.
	leading func() bool
	// abstain gives up the Lease and stops campaigning while true (nil
	// without leader election).
	abstain func(bool)
}

// replicaName is --replica-name, else $POD_NAME, else the host name and
// the process ID (two processes on one host must not share an identity:
// both would think they hold the Lease), made a DNS subdomain.
func (f serverFlags) replica() string {
	name := f.replicaName
	if name == "" {
		name = os.Getenv("POD_NAME")
	}
	if name == "" {
		host, _ := os.Hostname()
		name = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	name = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '.':
			return r
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '-'
	}, name)
	return strings.Trim(text.Truncate(name, 200), "-.")
}

// onceOnlyWork sets up the replicas: the Lease relaymesh-server
// (--leader-elect, the default), or this process alone.
func (f serverFlags) onceOnlyWork(kube *kubeclient.Clients, reg prometheus.Registerer, log *slog.Logger) (*replicas, error) {
	if !f.leaderElect {
		log.Warn("leader election is off (--leader-elect=false): this process runs the once-only work; run exactly one server replica")
		var tasks []lease.Task
		return &replicas{add: func(t lease.Task) { tasks = append(tasks, t) }, run: func(ctx context.Context) {
			for _, t := range tasks {
				go t.Run(ctx)
			}
		}, leading: func() bool { return true }}, nil
	}
	name := f.replica()
	// Coordination (the Leases, the heads) has a client of its own: behind
	// a storm's thousands of status and mirror writes in the shared
	// client's rate limiter, a Lease renewal would miss its deadline and
	// a head would reach the agents seconds late.
	cfg := rest.CopyConfig(kube.Config)
	cfg.QPS, cfg.Burst = 50, 100
	coord, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	e, err := lease.New(lease.Config{Client: coord, Namespace: f.namespace, Name: serverLease, Identity: name,
		LeaseDuration: f.leaseDuration, RenewDeadline: f.renewDeadline, RetryPeriod: f.retryPeriod, Logger: log, Registerer: reg, Metrics: leader.Metrics()})
	if err != nil {
		return nil, err
	}
	log.Info("leader election on: once-only work runs while this replica holds the Lease", "lease", f.namespace+"/"+serverLease, "replica", name)
	return &replicas{name: name, add: e.Add, run: e.Run, leading: e.Leading, abstain: e.Abstain, coord: coord}, nil
}

// replicaHeartbeat is how often a replica renews its own Lease, and how
// often the leader looks for clusters of replicas that are gone (their
// Lease lasts 3 heartbeats).
const replicaHeartbeat = 5 * time.Second

// serverLease is the Lease the server's replicas elect a leader with.
const serverLease = leader.ServerLease

// releasingSink forgets a cluster's snapshot when its last session on this
// replica ends: the agent reconnects to some replica, which then owns the
// cluster's discovered objects.
type releasingSink struct {
	*server.KubeStatus
	view   *server.View
	mirror *server.Mirror
}

func (r releasingSink) SessionChanged(cluster string, connected bool) {
	r.KubeStatus.SessionChanged(cluster, connected)
	if !connected {
		r.view.Release(cluster)
		// Whoever owns the cluster's objects now decides again: if the
		// session ended because the cluster was deregistered, the leader
		// deletes them (the release may come before the view's removal,
		// which then has nothing to announce).
		r.mirror.Kick(cluster)
	}
}
