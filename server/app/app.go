package app

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/kubeinformers"
	"github.com/relaymesh/relaymesh/internal/kubeutil"
	"github.com/relaymesh/relaymesh/policy/admission"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/acks"
	"github.com/relaymesh/relaymesh/server/heads"
	"github.com/relaymesh/relaymesh/translation/controller"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// Deps are what Run is handed rather than builds.
type Deps struct {
	// Kube reaches the management cluster. Required.
	Kube *kubeclient.Clients
	// Logger receives the server's log (a component attribute is added).
	// Required.
	Logger *slog.Logger
	// Registry receives every metric of the process; nil: a new one.
	Registry *prometheus.Registry
	// Dashboard, if set, serves the dashboard from the server's parts; the
	// function it returns stops it.
	Dashboard func(context.Context, DashboardParts) (stop func(), err error)
	// Listening, if set, hears the addresses the server bound, once it
	// serves.
	Listening func(Addresses)
}

// DashboardParts are the server's own state the dashboard shows, and what
// it is served with.
type DashboardParts struct {
	View      *server.View
	Signer    ca.Signer
	Serving   *server.ServingCert
	AuditLog  *audit.Log
	Shared    *server.SharedSnapshots // nil unless the store is Redis
	Authority *ca.Authority
	Registry  prometheus.Registerer
}

// Addresses are the addresses the server bound (a port 0 in the Config
// becomes the kernel's pick).
type Addresses struct {
	Relay, Metrics string
	// Webhook is empty without a webhook.
	Webhook string
	// SPIFFEBundle is empty without the SPIFFE bundle endpoint.
	SPIFFEBundle string
	// SPIFFEBundleSPIFFE is the https_spiffe listener's, if served.
	SPIFFEBundleSPIFFE string
}

// process is the server's component graph, built by Run's steps in order.
type process struct {
	cfg  Config
	kube *kubeclient.Clients
	log  *slog.Logger
	reg  *prometheus.Registry
	deps Deps
	// bundles is the SPIFFE bundle endpoint once it serves (the trust
	// controller, started before it, reads what it publishes).
	bundles atomic.Pointer[bundleEndpoint]

	td                           spiffeid.TrustDomain
	audit                        *audit.Log
	signer                       ca.Signer
	authority                    *ca.Authority
	issuer                       *issuerWatch
	serving                      *server.ServingCert
	tokens                       *identity.Tokens
	tokenStore                   *identity.KubeTokenStore
	sharedToken                  *identity.SharedToken
	registry, kubeconfigClusters *server.Registry
	reps                         *replicas
	status                       *server.KubeStatus
	statusWrites                 dynamic.Interface // statusClient: KubernetesClusters' status, on a budget of their own
	view                         *server.View
	mirror                       *server.Mirror
	sharedSnaps                  *server.SharedSnapshots
	outputs                      *server.Outputs
	heads                        *heads.Writer
	ledger                       *acks.Ledger
	admitter                     *admission.Engine
	loader                       *admission.Loader
	ctl                          *controller.Controller
	trust                        *trust.Controller
	importer                     *trust.Importer
	inProcess                    *server.InProcessAgents
	// informers watch each resource once for every component
	// (issue 31: four watches of every KubernetesCluster before).
	informers            *kubeinformers.Shared
	srv                  *server.Server
	webhook              *admission.Registration
	relayLis, metricsLis net.Listener
	addrs                Addresses

	// closers run when Run returns, last first.
	closers []func()
}

// waitFor makes Run, as it returns, wait for done, at most limit; late, if
// set, is logged when the limit passes first.
func (p *process) waitFor(done <-chan struct{}, limit time.Duration, late string) {
	p.closers = append(p.closers, func() {
		select {
		case <-done:
		case <-time.After(limit):
			if late != "" {
				p.log.Warn(late)
			}
		}
	})
}

// Run validates cfg, builds the management server and serves until ctx
// ends (nil) or serving fails.
func Run(ctx context.Context, cfg Config, deps Deps) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if deps.Kube == nil || deps.Logger == nil {
		return errors.New("server: Deps.Kube and Deps.Logger are required")
	}
	p := &process{cfg: cfg, kube: deps.Kube, log: deps.Logger.With("component", "server"), reg: deps.Registry, deps: deps,
		td: spiffeid.RequireTrustDomainFromString(cfg.TrustDomain)} // Validate checked it
	p.informers = kubeinformers.NewShared(p.kube.Dynamic, cfg.Namespace)
	if p.reg == nil {
		p.reg = prometheus.NewRegistry()
	}
	defer p.close()
	for _, step := range []func(context.Context) error{
		p.newAudit, p.newSigner, p.newReplicas, p.newServing, p.newTokens, p.newClusters, p.newStatus, p.newDataPath,
		p.newSharedSnapshots, p.newOutputs, p.newTranslation, p.newRelayServer, p.newListeners, p.newWebhook, p.newOps,
		p.newBundleEndpoint,
	} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	p.addOnceOnlyWork()
	p.runOnceOnlyWork(ctx)
	return p.serve(ctx)
}

// close stops what Run started and waits for what must end, last first.
func (p *process) close() {
	for i := len(p.closers) - 1; i >= 0; i-- {
		p.closers[i]()
	}
}

// newAudit opens the audit log in the server's namespace, which must
// exist.
func (p *process) newAudit(ctx context.Context) error {
	if _, err := p.kube.Typed.CoreV1().Namespaces().Get(ctx, p.cfg.Namespace, metav1.GetOptions{}); err != nil {
		return fmt.Errorf("namespace %s: %w", p.cfg.Namespace, err)
	}
	auditLog, err := audit.Open(audit.Config{Path: p.cfg.AuditLog, Sync: true})
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	p.audit = auditLog
	p.closers = append(p.closers, func() { _ = auditLog.Close() })
	return nil
}

// newServing issues the relay port's certificate. relay-server-tls-secret
// has one writer: the only replica, at once, or with several the Lease
// holder (the once-only task serving-secret).
func (p *process) newServing(ctx context.Context) error {
	ips, err := parseIPs("--server-ips", p.cfg.ServerIPs)
	if err != nil {
		return err
	}
	var store func(context.Context, []byte, []byte) error
	if !p.reps.several {
		store = p.storeServingSecret
	}
	if p.serving, err = server.NewServingCert(ctx, servingIssuer{p.authority, p.crossIssued}, p.cfg.ServerDNSNames, ips, store, p.log); err != nil {
		return err
	}
	if p.reps.several {
		p.serving.SetStore(p.storeServingSecret, p.reps.leading)
	}
	go p.serving.Run(ctx)
	go p.reloadEvery(ctx, func() { p.followIssuingCA(ctx) })
	return nil
}

// servingIssuer issues the serving certificate with the chain a relay
// root rotation needs: the issuing CA, then (in Switching) the issuing CA
// cross-issued by the other root, so that an agent still pinning only
// that root verifies the server (ca/crossissue.go).
type servingIssuer struct {
	*ca.Authority
	cross func() []*x509.Certificate
}

// IssueServerRequest issues as the authority does and appends the
// cross-issued CAs to the chain.
func (s servingIssuer) IssueServerRequest(ctx context.Context, csr *x509.CertificateRequest, dnsNames []string, ips []net.IP) (*ca.Issued, error) {
	issued, err := s.Authority.IssueServerRequest(ctx, csr, dnsNames, ips)
	if err != nil {
		return nil, err
	}
	issued.Chain = append(slices.Clip(issued.Chain), s.cross()...)
	return issued, nil
}

// crossIssued is what the serving chain carries after the issuing CA: the
// relay CA's cross-issued CA during a root rotation, nothing otherwise
// (and never with a back-end signer, which does not rotate roots).
func (p *process) crossIssued() []*x509.Certificate {
	if r, ok := p.signer.(*ca.RelayIssuers); ok {
		return r.CrossIssued()
	}
	return nil
}

// followIssuingCA renews the serving certificate if the chain it would be
// issued with changed since it was: a renewal of the issuing CA, and above
// all a relay root rotation switching issuance to the new root (after
// which the old root leaves the agents' bundle and a certificate still
// under it would be refused by every agent) or adding or dropping the
// cross-issued CA. It runs every --relay-issuer-check-interval.
func (p *process) followIssuingCA(ctx context.Context) {
	cert, _ := p.serving.Certificate()
	chain, cross := p.authority.Chain(), p.crossIssued()
	want := append(slices.Clone(chain), cross...)
	if slices.EqualFunc(cert.Certificate[1:], want, func(der []byte, c *x509.Certificate) bool { return bytes.Equal(der, c.Raw) }) {
		return
	}
	if err := p.serving.Renew(ctx); err != nil {
		if ctx.Err() == nil {
			p.log.Error("could not renew the serving certificate for the relay CA's new chain; retrying", "error", err, "retry_in", p.cfg.CA.IssuerCheck)
		}
		return
	}
	p.log.Info("renewed the serving certificate for the relay CA's new chain", "issuer", chain[0].Subject.String(), "cross_issued", len(cross))
}

// storeServingSecret writes relay-server-tls-secret for operators and tools
// that expect it; every replica serves its own certificate from memory.
func (p *process) storeServingSecret(ctx context.Context, certPEM, keyPEM []byte) error {
	return kubeutil.UpsertSecret(ctx, p.kube.Typed, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "relay-server-tls-secret", Namespace: p.cfg.Namespace, Labels: map[string]string{"app.kubernetes.io/managed-by": "relaymesh"}},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM},
	})
}

// newTokens builds the bootstrap tokens (records from a watch: a
// bootstrap is one API call) and, WEAKER, the shared token.
func (p *process) newTokens(ctx context.Context) error {
	store, err := identity.NewKubeTokenStore(p.kube.Typed, p.cfg.Namespace)
	if err != nil {
		return err
	}
	if err := store.WatchCache(ctx); err != nil {
		return err
	}
	p.tokenStore = store
	if p.tokens, err = identity.NewTokens(identity.TokensConfig{Store: store}); err != nil {
		return err
	}
	if !p.cfg.AllowSharedToken {
		return nil
	}
	sec, err := p.kube.Typed.CoreV1().Secrets(p.cfg.Namespace).Get(ctx, identity.TokenSecret, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("--allow-shared-token: secret %s/%s: %w", p.cfg.Namespace, identity.TokenSecret, err)
	}
	if p.sharedToken, err = identity.NewSharedToken(string(sec.Data[identity.KeyToken])); err != nil {
		return fmt.Errorf("--allow-shared-token: %w", err)
	}
	return nil
}

// newClusters watches the registered clusters (relay mode and, if
// allowed, kubeconfig mode).
func (p *process) newClusters(ctx context.Context) error {
	p.registry = server.NewRegistry()
	if p.cfg.AllowKubeconfigClusters {
		p.kubeconfigClusters = server.NewRegistry()
		p.log.Warn("kubeconfig-mode clusters are allowed: the server will hold credentials for every cluster registered that way; relay mode is the secure choice")
	}
	return server.WatchClusters(ctx, p.kube.Dynamic, p.informers, p.cfg.Namespace, p.registry, p.kubeconfigClusters, p.log)
}

// place is what this replica knows of cluster c now.
func (p *process) place(c string) clusterPlace {
	_, relayMode := p.registry.Lookup(c)
	_, kubeconfigMode := p.kubeconfigClusters.Lookup(c)
	return clusterPlace{session: p.view.Has(c), relay: relayMode, kubeconfig: kubeconfigMode, leading: p.reps.leading()}
}

// registered says whether cluster c is registered in either mode.
func (p *process) registered(c string) bool {
	_, relayMode := p.registry.Lookup(c)
	_, kubeconfigMode := p.kubeconfigClusters.Lookup(c)
	return isRegistered(clusterPlace{relay: relayMode, kubeconfig: kubeconfigMode})
}

// clusterNames are the registered clusters of both modes.
func (p *process) clusterNames() []string {
	return append(p.registry.Names(), p.kubeconfigClusters.Names()...)
}

// newStatus builds the clusters' status writer (with several replicas,
// state they share goes through the apiserver).
func (p *process) newStatus(ctx context.Context) (err error) {
	cfg := server.StatusConfig{Replica: p.reps.name, Informers: p.informers}
	if p.reps.several {
		// Acks are recorded in batches in the ack ledger, where the
		// Lease holder reads every cluster's whichever replica its agent
		// talks to; the status keeps what was applied.
		ledger := acks.New(p.reps.coord, p.cfg.Namespace, p.log, 0)
		cfg.Ledger = ledger
		defer func() {
			if err == nil {
				err = ledger.Start(ctx)
			}
		}()
		p.ledger = ledger
		// The Lease holder deletes a deregistered cluster's record, the
		// others only drop what they queued for it; a new Lease holder
		// sweeps what was deregistered between terms (pruneAckLedger).
		p.registry.OnRevoke(func(c string) {
			if p.reps.leading() {
				ledger.Forget(c)
			} else {
				ledger.Drop(c)
			}
		})
	}
	writes, err := statusClient(p.kube.Config)
	if err != nil {
		return err
	}
	p.statusWrites = writes
	p.status = server.NewKubeStatus(writes, p.cfg.Namespace, p.log, cfg)
	p.registry.OnRevoke(p.status.Forget)
	p.registry.OnEnded(p.status.Ended)
	go p.status.Run(ctx)
	return nil
}

// statusClient returns the client KubeStatus writes KubernetesCluster
// statuses with, and the trust controller their status.trustDomains (a
// write when a cluster is registered and one when its mesh is mirrored:
// through the server's dynamic client, a fleet's verdicts queued with the
// mirror's creates): a rate limiter of its own, as large as the server's
// (--kube-qps, which cfg carries). At a storm's end the mirror creates as
// fast as that budget allows, and statuses queued behind it were written
// 15 s after their sessions opened (76 of 10,000 still not connected 5 s
// after the last session; issue 31). A smaller budget of their own is
// not enough: a storm of 10,000 writes 55 statuses a second on average,
// and at 50/s, 2,813 of 10,000 statuses were not yet connected 5 s after
// the last session. What the status writer reads comes from the shared
// informers.
func statusClient(cfg *rest.Config) (dynamic.Interface, error) {
	return dynamic.NewForConfig(kubeclient.OwnBudget(cfg, 0, 0))
}

// newDataPath builds the view of the clusters' snapshots and the mirror
// that turns them into discovered objects.
func (p *process) newDataPath(ctx context.Context) error {
	p.view = server.NewView()
	// Acks go to the cluster's status, where the replica holding the Lease
	// reads every cluster's, whichever replica the agent talks to.
	p.view.OnAck(func(c string) { p.status.Acked(c, p.view.Ack(c)) })
	workloadsIn := multiclusterv1alpha1.WorkloadsInAPIServer
	if p.cfg.SnapshotStore.Kind == StoreRedis {
		workloadsIn = multiclusterv1alpha1.WorkloadsInRedis
	}
	p.view.OnSnapshot(func(c string) {
		if snap := p.view.Snapshot(c); snap != nil {
			p.status.Discovered(c, server.Summarize(snap, workloadsIn))
		}
	})
	mirrorCfg := server.MirrorConfig{Registerer: p.reg, WorkloadsElsewhere: p.cfg.SnapshotStore.Kind == StoreRedis, Informers: p.informers}
	if p.reps.several {
		mirrorCfg.Owns = func(c string) bool { return ownsDiscovered(p.place(c)) }
	}
	p.mirror = server.NewMirrorWithConfig(p.kube.Dynamic, p.cfg.Namespace, p.view, p.log, mirrorCfg)
	p.registry.OnRevoke(p.mirror.Kick)
	go p.mirror.Run(ctx)
	return nil
}

// newOutputs builds the per-cluster outputs, with several replicas in the
// order of the leader's heads, and the pass-through objects.
func (p *process) newOutputs(ctx context.Context) error {
	p.outputs = server.NewOutputs(time.Now())
	if p.reps.several {
		store := heads.New(p.reps.coord, p.cfg.Namespace, p.log)
		store.OnChange(p.outputs.HeadChanged)
		if err := store.Start(ctx); err != nil {
			return err
		}
		p.outputs.UseHeads(store.Head)
		p.heads = heads.NewWriter(store, p.outputs, p.log)
		// A term's leader adopted the heads: statuses and rotations start.
		p.heads.Adopted = func() { p.ctl.Kick(); p.trust.Kick() }
		p.outputs.OnPublish(p.heads.Dirty)
	}
	_, err := server.RunPassthrough(ctx, p.kube.Dynamic, p.cfg.Namespace, p.outputs, p.log, p.sources()...)
	return err
}

// sources are the registries of both modes.
func (p *process) sources() []*server.Registry {
	if p.kubeconfigClusters != nil {
		return []*server.Registry{p.registry, p.kubeconfigClusters}
	}
	return []*server.Registry{p.registry}
}
