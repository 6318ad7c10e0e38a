package trust

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/relaymesh/relaymesh/trust/spiffefed"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
)

// Importing foreign SPIFFE bundles (docs/spiffe-federation.md,
// docs/design/2026-12-03-spiffe-import.md): the Lease holder fetches the
// bundle endpoint of every FederatedTrustDomain in the server's namespace,
// refuses hostile answers with the last accepted bundle kept, and writes
// what it accepted into the object's status, where every replica reads it.

// importFieldManager owns the status of FederatedTrustDomains.
const importFieldManager = "relaymesh-spiffe-import"

// Retry bounds after a refused fetch: doubled from the first up to the
// last, never later than the accepted bundle's own refresh.
const (
	importRetryFirst = 30 * time.Second
	importRetryMax   = 5 * time.Minute
)

// Metrics of importing foreign bundles, by trust_domain label (one per
// FederatedTrustDomain, which only an operator creates).
const (
	// MetricImportFetches counts fetches by result: accepted, or the
	// reason of the refusal (spiffefed.RefuseReason; "invalid" for a spec
	// that cannot be fetched).
	MetricImportFetches = "relaymesh_spiffe_import_fetches_total"
	// MetricImportAccepted is when a bundle was last accepted: its age is
	// time() minus it.
	MetricImportAccepted = "relaymesh_spiffe_import_accepted_timestamp_seconds"
	// MetricImportSequence is the accepted bundle's spiffe_sequence.
	MetricImportSequence = "relaymesh_spiffe_import_sequence"
)

// ImporterConfig configures an Importer.
type ImporterConfig struct {
	Dynamic   dynamic.Interface
	Namespace string
	Audit     audit.Recorder
	Log       *slog.Logger
	// Fetcher fetches and checks the bundles; nil: the defaults.
	Fetcher *spiffefed.Fetcher
	// Reserved are trust domains no FederatedTrustDomain may name besides
	// those granted to registered clusters (the relay's own).
	Reserved []string
	// Registerer takes the metrics; nil: not registered.
	Registerer prometheus.Registerer
	// Refresh is when to fetch again after an accepted bundle; nil:
	// spiffefed.NextRefresh (the peer's refresh hint, clamped).
	Refresh func(*spiffebundle.Bundle) time.Duration
	// RetryFirst is the first retry after a refusal, doubled up to
	// importRetryMax; zero: importRetryFirst.
	RetryFirst time.Duration
}

// Importer fetches foreign bundles while Run runs (the Lease holder).
type Importer struct {
	cfg     ImporterConfig
	log     *slog.Logger
	fetcher *spiffefed.Fetcher

	fetches  *prometheus.CounterVec
	accepted *prometheus.GaugeVec
	sequence *prometheus.GaugeVec

	mu      sync.Mutex
	workers map[string]*importWorker
}

type importWorker struct {
	cancel context.CancelFunc
	kick   chan struct{}
	td     string
}

// NewImporter builds an Importer and registers its metrics.
func NewImporter(cfg ImporterConfig) (*Importer, error) {
	im := &Importer{cfg: cfg, log: cfg.Log, fetcher: cfg.Fetcher, workers: map[string]*importWorker{},
		fetches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricImportFetches,
			Help: "Fetches of foreign SPIFFE bundles (FederatedTrustDomains) by trust domain and result: accepted, or why the answer was refused."}, []string{"trust_domain", "result"}),
		accepted: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricImportAccepted,
			Help: "When the foreign trust domain's bundle was last accepted (Unix seconds): its age is time() minus this."}, []string{"trust_domain"}),
		sequence: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricImportSequence,
			Help: "spiffe_sequence of the foreign trust domain's accepted bundle."}, []string{"trust_domain"}),
	}
	if im.log == nil {
		im.log = slog.Default()
	}
	im.log = im.log.With("component", "spiffe-import")
	if im.cfg.Refresh == nil {
		im.cfg.Refresh = spiffefed.NextRefresh
	}
	if im.cfg.RetryFirst <= 0 {
		im.cfg.RetryFirst = importRetryFirst
	}
	if im.fetcher == nil {
		im.fetcher = spiffefed.NewFetcher(spiffefed.FetcherOptions{})
	}
	if cfg.Audit == nil {
		return nil, errors.New("spiffe import: no audit recorder")
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{im.fetches, im.accepted, im.sequence} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return im, nil
}

// Run fetches every FederatedTrustDomain of the namespace until ctx ends.
func (im *Importer) Run(ctx context.Context) {
	f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(im.cfg.Dynamic, 10*time.Minute, im.cfg.Namespace, nil)
	inf := f.ForResource(networkingv1alpha1.FederatedTrustDomains).Informer()
	changed := func(obj any) {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			im.follow(ctx, inf.GetStore(), u.GetName())
		}
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    changed,
		UpdateFunc: func(old, obj any) { changed(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if u, ok := obj.(*unstructured.Unstructured); ok {
				im.stop(u.GetName())
			}
		},
	})
	if err != nil {
		im.log.Error("cannot watch FederatedTrustDomains: no foreign bundle is fetched", "error", err)
		return
	}
	f.Start(ctx.Done())
	<-ctx.Done()
	f.Shutdown()
	im.mu.Lock()
	for name, w := range im.workers {
		w.cancel()
		delete(im.workers, name)
	}
	im.mu.Unlock()
}

// follow starts the worker of name, or wakes it for a change of its spec.
func (im *Importer) follow(ctx context.Context, store cache.Store, name string) {
	im.mu.Lock()
	defer im.mu.Unlock()
	if w, ok := im.workers[name]; ok {
		select {
		case w.kick <- struct{}{}:
		default:
		}
		return
	}
	wctx, cancel := context.WithCancel(ctx)
	w := &importWorker{cancel: cancel, kick: make(chan struct{}, 1)}
	im.workers[name] = w
	go im.work(wctx, store, name, w)
}

func (im *Importer) stop(name string) {
	im.mu.Lock()
	defer im.mu.Unlock()
	if w, ok := im.workers[name]; ok {
		w.cancel()
		delete(im.workers, name)
		if w.td != "" {
			im.forget(w.td)
		}
	}
}

func (im *Importer) forget(td string) {
	im.accepted.DeleteLabelValues(td)
	im.sequence.DeleteLabelValues(td)
	im.fetches.DeletePartialMatch(prometheus.Labels{"trust_domain": td})
}

// work fetches one FederatedTrustDomain's bundle at its refresh hint (or
// the retry after a refusal), and again at once when its spec changes.
func (im *Importer) work(ctx context.Context, store cache.Store, name string, w *importWorker) {
	retry := im.cfg.RetryFirst
	fetched := int64(-1) // the generation last fetched for
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		kicked := false
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
			kicked = true
		case <-timer.C:
		}
		obj, ok, _ := store.GetByKey(im.cfg.Namespace + "/" + name)
		if !ok {
			return
		}
		u := obj.(*unstructured.Unstructured)
		// Every status write wakes the worker too: only a new spec is
		// fetched for before the wait ends.
		if kicked && u.GetGeneration() == fetched {
			continue
		}
		var ftd networkingv1alpha1.FederatedTrustDomain
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &ftd); err != nil {
			im.log.Error("cannot read a FederatedTrustDomain", "name", name, "error", err)
			return
		}
		fetched = ftd.Generation
		wait, accepted := im.fetchOnce(ctx, &ftd, w)
		if accepted {
			retry = im.cfg.RetryFirst
		} else {
			wait = min(wait, retry)
			retry = min(2*retry, importRetryMax)
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
	}
}

// fetchOnce fetches ftd's bundle once and writes the verdict into its
// status. It returns when to fetch again and whether a bundle was
// accepted.
func (im *Importer) fetchOnce(ctx context.Context, ftd *networkingv1alpha1.FederatedTrustDomain, w *importWorker) (time.Duration, bool) {
	td := ftd.Spec.TrustDomain
	im.mu.Lock()
	if w.td != td && w.td != "" {
		im.forget(w.td)
	}
	w.td = td
	im.mu.Unlock()
	now := metav1.NewTime(time.Now().UTC().Truncate(time.Second))

	peer, bootstrap, err := peerOf(ftd)
	if err == nil {
		err = im.notOwn(ctx, td)
	}
	if err != nil {
		if ctx.Err() != nil {
			return 0, false
		}
		im.fetches.WithLabelValues(td, "invalid").Inc()
		im.accepted.DeleteLabelValues(td)
		im.sequence.DeleteLabelValues(td)
		im.log.Warn("a FederatedTrustDomain is not fetched", "name", ftd.Name, "trust_domain", td, "error", err)
		// Checked again later: a grant that made it Invalid may go.
		im.write(ctx, ftd, networkingv1alpha1.FederatedTrustDomainStatus{State: networkingv1alpha1.FederatedInvalid,
			Error: text.Truncate(err.Error(), 1024), LastFetch: &now})
		return importRetryMax, false
	}

	last := storedBundle(ftd)
	from := last
	if from == nil {
		from = bootstrap // https_spiffe: what authenticates the first fetch
	}
	b, err := im.fetcher.Fetch(ctx, peer, from)
	if ctx.Err() != nil {
		return 0, false // the term ended: nothing to record
	}
	if err == nil && (last == nil || !sameBundle(last, b)) {
		if aerr := im.cfg.Audit.Record(acceptEvent(ftd, b)); aerr != nil {
			err = fmt.Errorf("the bundle was not accepted: its acceptance could not be audited: %w", aerr)
		}
	}
	if err != nil {
		reason := refuseReason(err)
		im.fetches.WithLabelValues(td, reason).Inc()
		msg := text.Truncate(err.Error(), 1024)
		if aerr := im.cfg.Audit.Record(audit.Event{Type: audit.TrustBundleRefuse, Result: audit.ResultFailure, Subject: td,
			Reason: text.Truncate(msg, 900), Details: map[string]string{"reason": reason, "federatedTrustDomain": ftd.Name}}); aerr != nil {
			im.log.Error("a refused foreign bundle could not be audited", "trust_domain", td, "error", aerr)
		}
		im.log.Warn("refused the answer of a foreign bundle endpoint; the last accepted bundle is kept", "trust_domain", td, "reason", reason, "error", msg)
		st := networkingv1alpha1.FederatedTrustDomainStatus{State: networkingv1alpha1.FederatedPending, Error: msg, LastFetch: &now}
		wait := importRetryMax
		if last != nil {
			st = *ftd.Status.DeepCopy()
			st.State, st.Error, st.LastFetch = networkingv1alpha1.FederatedStale, msg, &now
			wait = im.cfg.Refresh(last)
		}
		im.write(ctx, ftd, st)
		return wait, false
	}

	st := networkingv1alpha1.FederatedTrustDomainStatus{State: networkingv1alpha1.FederatedCurrent, LastFetch: &now, LastAccepted: &now}
	if last != nil && sameBundle(last, b) && ftd.Status.LastAccepted != nil {
		st.LastAccepted = ftd.Status.LastAccepted // nothing new was accepted
	}
	if seq, ok := b.SequenceNumber(); ok {
		st.Sequence = seq
		im.sequence.WithLabelValues(td).Set(float64(seq))
	}
	if hint, ok := b.RefreshHint(); ok {
		st.RefreshHint = int64(hint / time.Second)
	}
	var pemOut bytes.Buffer
	for _, c := range sortedRoots(b.X509Authorities()) {
		st.Roots = append(st.Roots, networkingv1alpha1.FederatedRoot{Fingerprint: Fingerprint(c),
			Subject: text.Truncate(c.Subject.String(), 1024), NotAfter: metav1.NewTime(c.NotAfter.UTC())})
		_ = pem.Encode(&pemOut, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	st.BundlePEM = pemOut.String()
	im.fetches.WithLabelValues(td, "accepted").Inc()
	im.accepted.WithLabelValues(td).Set(float64(st.LastAccepted.Unix()))
	im.write(ctx, ftd, st)
	return im.cfg.Refresh(b), true
}

// write applies st as ftd's status (server-side apply: the fields st
// leaves empty are removed).
func (im *Importer) write(ctx context.Context, ftd *networkingv1alpha1.FederatedTrustDomain, st networkingv1alpha1.FederatedTrustDomainStatus) {
	st.ObservedGeneration = ftd.Generation
	body, err := json.Marshal(map[string]any{
		"apiVersion": networkingv1alpha1.GroupVersion.String(), "kind": "FederatedTrustDomain",
		"metadata": map[string]any{"name": ftd.Name, "namespace": ftd.Namespace},
		"status":   st,
	})
	if err != nil {
		im.log.Error("cannot encode a FederatedTrustDomain's status", "name", ftd.Name, "error", err)
		return
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = im.cfg.Dynamic.Resource(networkingv1alpha1.FederatedTrustDomains).Namespace(ftd.Namespace).
		Patch(wctx, ftd.Name, types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: importFieldManager, Force: new(true)}, "status")
	if err != nil && ctx.Err() == nil {
		im.log.Warn("could not write a FederatedTrustDomain's status", "name", ftd.Name, "error", err)
	}
}

// peerOf is the endpoint ftd names, and for https_spiffe the bootstrap
// bundle; an error says why the spec cannot be used.
func peerOf(ftd *networkingv1alpha1.FederatedTrustDomain) (spiffefed.Peer, *spiffebundle.Bundle, error) {
	s := ftd.Spec
	td, err := spiffefed.ParseTrustDomain(s.TrustDomain)
	if err != nil {
		return spiffefed.Peer{}, nil, fmt.Errorf("spec.trustDomain: %w", err)
	}
	u, err := url.Parse(s.BundleEndpointURL)
	switch {
	case err != nil:
		return spiffefed.Peer{}, nil, errors.New("spec.bundleEndpointURL is not a URL")
	case u.Scheme != "https" || u.Host == "" || u.Opaque != "":
		return spiffefed.Peer{}, nil, errors.New("spec.bundleEndpointURL must be an https:// URL with a host")
	case u.User != nil:
		// Never echoed: it would be a credential.
		return spiffefed.Peer{}, nil, errors.New("spec.bundleEndpointURL must not carry user information (a bundle endpoint takes no client authentication)")
	}
	p := spiffefed.Peer{TrustDomain: td, URL: u.String()}
	switch s.Profile {
	case string(spiffefed.ProfileWeb):
		p.Profile = spiffefed.ProfileWeb
		if s.WebRootsPEM != "" {
			roots, err := spiffefed.ParseRoots([]byte(s.WebRootsPEM))
			if err != nil {
				return spiffefed.Peer{}, nil, fmt.Errorf("spec.webRootsPEM: %w", err)
			}
			p.WebRoots = x509.NewCertPool()
			for _, r := range roots {
				p.WebRoots.AddCert(r)
			}
		}
		return p, nil, nil
	case string(spiffefed.ProfileSPIFFE):
		p.Profile = spiffefed.ProfileSPIFFE
		id, err := spiffeid.FromString(s.EndpointSPIFFEID)
		if err != nil || !id.MemberOf(td) || id.Path() == "" {
			return spiffefed.Peer{}, nil, fmt.Errorf("spec.endpointSPIFFEID must be a SPIFFE ID with a path in %s", td)
		}
		p.EndpointID = id
		roots, err := spiffefed.ParseRoots([]byte(s.BootstrapBundle))
		if err != nil {
			return spiffefed.Peer{}, nil, fmt.Errorf("spec.bootstrapBundle: %w", err)
		}
		return p, spiffebundle.FromX509Authorities(td, roots), nil
	}
	return spiffefed.Peer{}, nil, fmt.Errorf("spec.profile %q: must be https_web or https_spiffe", text.Truncate(s.Profile, 32))
}

// notOwn refuses a trust domain that is this Relaymesh's own: granted to a
// registered cluster (so VirtualMeshes publish it) or reserved. A foreign
// root must never vouch for those identities.
func (im *Importer) notOwn(ctx context.Context, td string) error {
	if slices.Contains(im.cfg.Reserved, td) {
		return fmt.Errorf("trust domain %s is this Relaymesh's own: a foreign bundle may not vouch for its identities", td)
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	list, err := im.cfg.Dynamic.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(im.cfg.Namespace).List(lctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("cannot list the registered clusters to check that trust domain %s is not one of theirs: %w", td, err)
	}
	for _, item := range list.Items {
		var kc multiclusterv1alpha1.KubernetesCluster
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(item.Object, &kc); err != nil {
			continue
		}
		for _, g := range kc.Grant() {
			if g.Name == td {
				return fmt.Errorf("trust domain %s is granted to registered cluster %s: a foreign bundle may not vouch for its identities", td, kc.Name)
			}
		}
	}
	return nil
}

// storedBundle is the bundle ftd's status holds for its current spec, or
// nil.
func storedBundle(ftd *networkingv1alpha1.FederatedTrustDomain) *spiffebundle.Bundle {
	st := ftd.Status
	if st.ObservedGeneration != ftd.Generation || st.BundlePEM == "" ||
		(st.State != networkingv1alpha1.FederatedCurrent && st.State != networkingv1alpha1.FederatedStale) {
		return nil
	}
	td, err := spiffefed.ParseTrustDomain(ftd.Spec.TrustDomain)
	if err != nil {
		return nil
	}
	roots, err := spiffefed.ParseRoots([]byte(st.BundlePEM))
	if err != nil {
		return nil
	}
	b := spiffebundle.FromX509Authorities(td, roots)
	if st.Sequence > 0 {
		b.SetSequenceNumber(st.Sequence)
	}
	if st.RefreshHint > 0 {
		b.SetRefreshHint(time.Duration(st.RefreshHint) * time.Second)
	}
	return b
}

// sameBundle: the same sequence (or none in both) and the same roots.
func sameBundle(a, b *spiffebundle.Bundle) bool {
	sa, oka := a.SequenceNumber()
	sb, okb := b.SequenceNumber()
	if oka != okb || sa != sb {
		return false
	}
	return slices.EqualFunc(sortedRoots(a.X509Authorities()), sortedRoots(b.X509Authorities()), (*x509.Certificate).Equal)
}

func sortedRoots(roots []*x509.Certificate) []*x509.Certificate {
	out := slices.Clone(roots)
	slices.SortFunc(out, func(a, b *x509.Certificate) int { return bytes.Compare(a.Raw, b.Raw) })
	return out
}

func acceptEvent(ftd *networkingv1alpha1.FederatedTrustDomain, b *spiffebundle.Bundle) audit.Event {
	var fps []string
	for _, c := range sortedRoots(b.X509Authorities()) {
		fps = append(fps, Fingerprint(c))
	}
	d := map[string]string{"federatedTrustDomain": ftd.Name, "profile": ftd.Spec.Profile, "roots": strings.Join(fps, ",")}
	if seq, ok := b.SequenceNumber(); ok {
		d["sequence"] = strconv.FormatUint(seq, 10)
	}
	return audit.Event{Type: audit.TrustBundleAccept, Result: audit.ResultSuccess, Subject: ftd.Spec.TrustDomain, Details: d}
}

// refuseReason is the metric label of a refusal.
func refuseReason(err error) string {
	var r *spiffefed.Refused
	if errors.As(err, &r) {
		return string(r.Reason)
	}
	return "audit"
}
