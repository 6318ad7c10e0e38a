package trust

import (
	"context"
	"crypto/x509"
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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
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
	wg      sync.WaitGroup
}

type importWorker struct {
	cancel context.CancelFunc
	kick   chan struct{}
	td     string // the trust domain its metrics are labelled with
	// audited is the bundle (bundleKey) whose acceptance was last
	// audited: a write that failed does not audit it again.
	audited string
}

// errCannotCheck: whether a trust domain is one of ours could not be
// decided now (the apiserver did not answer). Nothing is changed: the
// stored bundle and its sequence stay, and the check runs again.
var errCannotCheck = errors.New("cannot check the trust domain against the registered clusters")

// NewImporter builds an Importer and registers its metrics.
func NewImporter(cfg ImporterConfig) (*Importer, error) {
	if cfg.Audit == nil {
		return nil, errors.New("spiffe import: no audit recorder")
	}
	im := &Importer{cfg: cfg, log: cfg.Log, fetcher: cfg.Fetcher, workers: map[string]*importWorker{},
		fetches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricImportFetches,
			Help: "Fetches of foreign SPIFFE bundles (FederatedTrustDomains) by trust domain and result: accepted, or why the answer was refused."}, []string{"trust_domain", "result"}),
		accepted: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricImportAccepted,
			Help: "When a fetch of the foreign trust domain's bundle was last accepted (Unix seconds; only on the Lease holder): its age is time() minus this."}, []string{"trust_domain"}),
		sequence: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricImportSequence,
			Help: "spiffe_sequence of the foreign trust domain's accepted bundle (only on the Lease holder)."}, []string{"trust_domain"}),
	}
	if im.log == nil {
		im.log = slog.New(slog.DiscardHandler)
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
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{im.fetches, im.accepted, im.sequence} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return im, nil
}

// Run fetches every FederatedTrustDomain of the namespace until ctx ends,
// then waits for its workers and drops its metrics (another replica
// fetches from then on).
func (im *Importer) Run(ctx context.Context) {
	defer func() {
		im.mu.Lock()
		for name, w := range im.workers {
			w.cancel()
			delete(im.workers, name)
		}
		im.mu.Unlock()
		im.wg.Wait()
		im.fetches.Reset()
		im.accepted.Reset()
		im.sequence.Reset()
	}()
	f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(im.cfg.Dynamic, 10*time.Minute, im.cfg.Namespace, nil)
	defer f.Shutdown()
	inf := f.ForResource(networkingv1alpha1.FederatedTrustDomains).Informer()
	changed := func(obj any) {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			im.follow(ctx, inf.GetStore(), u.GetName())
		}
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    changed,
		UpdateFunc: func(_, obj any) { changed(obj) },
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
}

// follow starts the worker of name, or wakes it for a change of its
// object.
func (im *Importer) follow(ctx context.Context, store cache.Store, name string) {
	im.mu.Lock()
	defer im.mu.Unlock()
	if ctx.Err() != nil {
		return
	}
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
	im.wg.Add(1)
	go func() {
		defer im.wg.Done()
		im.work(wctx, store, name, w)
	}()
}

// stop ends the worker of a deleted FederatedTrustDomain and drops its
// metrics.
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

// forget drops the metrics of td; im.mu is held.
func (im *Importer) forget(td string) {
	im.accepted.DeleteLabelValues(td)
	im.sequence.DeleteLabelValues(td)
	im.fetches.DeletePartialMatch(prometheus.Labels{"trust_domain": td})
}

// observe runs record on the metrics of w's trust domain td, unless w was
// stopped meanwhile (its FederatedTrustDomain deleted, the term over).
func (im *Importer) observe(name string, w *importWorker, td string, record func()) {
	im.mu.Lock()
	defer im.mu.Unlock()
	if im.workers[name] != w {
		return
	}
	if w.td != td && w.td != "" {
		im.forget(w.td)
	}
	w.td = td
	record()
}

// work fetches one FederatedTrustDomain's bundle at its refresh hint (or
// the retry after a refusal), and again at once when its object is made
// anew or its spec changes.
func (im *Importer) work(ctx context.Context, store cache.Store, name string, w *importWorker) {
	defer func() {
		im.mu.Lock()
		if im.workers[name] == w {
			delete(im.workers, name)
		}
		im.mu.Unlock()
	}()
	retry := im.cfg.RetryFirst
	fetched := "" // uid/generation last fetched for
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
			return // deleted: stop dropped its metrics
		}
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		// Every status write wakes the worker too: only a new object or a
		// new spec is fetched for before the wait ends.
		key := string(u.GetUID()) + "/" + strconv.FormatInt(u.GetGeneration(), 10)
		if kicked && key == fetched {
			continue
		}
		var ftd networkingv1alpha1.FederatedTrustDomain
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &ftd); err != nil {
			im.log.Error("cannot read a FederatedTrustDomain; waiting for a change of it", "name", name, "error", err)
			fetched = key
			continue
		}
		fetched = key
		wait, next := im.fetchOnce(ctx, &ftd, w)
		switch next {
		case nextRefresh:
			retry = im.cfg.RetryFirst
		case nextRetry:
			wait = min(wait, retry)
			retry = min(2*retry, importRetryMax)
		case nextSoon:
			wait = im.cfg.RetryFirst
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

// What fetchOnce asks of the worker.
type nextFetch int

const (
	// nextRefresh: a bundle was accepted; the wait is its refresh.
	nextRefresh nextFetch = iota
	// nextRetry: refused; the retry backs off, never later than the wait.
	nextRetry
	// nextAfter: exactly the wait (an Invalid spec is checked again then).
	nextAfter
	// nextSoon: nothing could be decided or stored; try again soon.
	nextSoon
)

// fetchOnce fetches ftd's bundle once and writes the verdict into its
// status. It returns when to fetch again.
func (im *Importer) fetchOnce(ctx context.Context, ftd *networkingv1alpha1.FederatedTrustDomain, w *importWorker) (time.Duration, nextFetch) {
	td := ftd.Spec.TrustDomain
	now := metav1.NewTime(time.Now().UTC().Truncate(time.Second))

	peer, bootstrap, err := peerOf(ftd)
	if err == nil {
		err = im.notOwn(ctx, td)
	}
	if ctx.Err() != nil {
		return 0, nextSoon // the term ended: nothing to record
	}
	if errors.Is(err, errCannotCheck) {
		im.observe(ftd.Name, w, td, func() { im.fetches.WithLabelValues(td, "check").Inc() })
		im.log.Warn("not fetching a foreign bundle now: its trust domain cannot be checked; the stored bundle stays", "name", ftd.Name, "trust_domain", td, "error", err)
		return 0, nextSoon
	}
	if err != nil {
		im.log.Warn("a FederatedTrustDomain is not fetched", "name", ftd.Name, "trust_domain", td, "error", err)
		// Checked again later: a grant that made it Invalid may go.
		if im.write(ctx, ftd, networkingv1alpha1.FederatedTrustDomainStatus{State: networkingv1alpha1.FederatedInvalid,
			Error: text.Truncate(err.Error(), 1024)}) == nil {
			im.observe(ftd.Name, w, td, func() {
				im.fetches.WithLabelValues(td, "invalid").Inc()
				im.accepted.DeleteLabelValues(td)
				im.sequence.DeleteLabelValues(td)
			})
		}
		return importRetryMax, nextAfter
	}

	last := storedBundle(ftd)
	from := last
	if from == nil {
		from = bootstrap // https_spiffe: what authenticates the first fetch
	}
	b, err := im.fetcher.Fetch(ctx, peer, from)
	if ctx.Err() != nil {
		return 0, nextSoon
	}
	changed := err == nil && (last == nil || !sameBundle(last, b))
	if changed && w.audited != bundleKey(td, b) {
		if aerr := im.cfg.Audit.Record(acceptEvent(ftd, b)); aerr != nil {
			err = fmt.Errorf("the bundle was not accepted: its acceptance could not be audited: %w", aerr)
		} else {
			w.audited = bundleKey(td, b)
		}
	}
	if err != nil {
		reason := refuseReason(err)
		if aerr := im.cfg.Audit.Record(audit.Event{Type: audit.TrustBundleRefuse, Result: audit.ResultFailure, Subject: td,
			Reason: text.Truncate(err.Error(), 900), Details: map[string]string{"reason": reason, "federatedTrustDomain": ftd.Name}}); aerr != nil {
			im.log.Error("a refused foreign bundle could not be audited", "trust_domain", td, "error", aerr)
		}
		im.log.Warn("refused the answer of a foreign bundle endpoint; the last accepted bundle is kept", "trust_domain", td, "reason", reason, "error", err)
		st := networkingv1alpha1.FederatedTrustDomainStatus{State: networkingv1alpha1.FederatedPending, Error: statusError(err), LastFetch: &now}
		wait := importRetryMax
		if last != nil {
			st = *ftd.Status.DeepCopy()
			st.State, st.Error, st.LastFetch = networkingv1alpha1.FederatedStale, statusError(err), &now
			wait = im.cfg.Refresh(last)
		}
		if im.write(ctx, ftd, st) == nil {
			im.observe(ftd.Name, w, td, func() { im.fetches.WithLabelValues(td, reason).Inc() })
		}
		return wait, nextRetry
	}

	st := networkingv1alpha1.FederatedTrustDomainStatus{State: networkingv1alpha1.FederatedCurrent, TrustDomain: td,
		LastFetch: &now, LastAccepted: &now, LastChanged: &now}
	if !changed && ftd.Status.LastChanged != nil {
		st.LastChanged = ftd.Status.LastChanged
	}
	seq, hasSeq := b.SequenceNumber()
	if hasSeq {
		st.Sequence = seq
	}
	if hint, ok := b.RefreshHint(); ok {
		st.RefreshHint = int64(hint / time.Second)
	}
	roots := spiffefed.SortedRoots(b.X509Authorities())
	for _, c := range roots {
		st.Roots = append(st.Roots, networkingv1alpha1.FederatedRoot{Fingerprint: Fingerprint(c),
			Subject: text.Truncate(c.Subject.String(), 1024), NotAfter: metav1.NewTime(c.NotAfter.UTC())})
	}
	st.BundlePEM = string(spiffefed.PEM(roots))
	if err := im.write(ctx, ftd, st); err != nil {
		// Not stored, so not accepted: counted and tried again soon (the
		// audit record says it was accepted; the next one will too).
		im.observe(ftd.Name, w, td, func() { im.fetches.WithLabelValues(td, "store").Inc() })
		return 0, nextSoon
	}
	im.observe(ftd.Name, w, td, func() {
		im.fetches.WithLabelValues(td, "accepted").Inc()
		im.accepted.WithLabelValues(td).Set(float64(now.Unix()))
		if hasSeq {
			im.sequence.WithLabelValues(td).Set(float64(seq))
		} else {
			im.sequence.DeleteLabelValues(td)
		}
	})
	return im.cfg.Refresh(b), nextRefresh
}

// statusError is what status.error says of a refusal: the reason, and the
// detail only where it cannot quote what an arbitrary HTTPS service
// answered (a FederatedTrustDomain may name any URL; its status is read
// by more people than the server's log and audit record are).
func statusError(err error) string {
	var r *spiffefed.Refused
	if !errors.As(err, &r) {
		return text.Truncate(err.Error(), 1024)
	}
	switch r.Reason {
	case spiffefed.RefuseFetch, spiffefed.RefuseStatus, spiffefed.RefuseMalformed:
		return fmt.Sprintf("the endpoint's answer was refused (%s: %s); the detail is in the server's log and the audit record trust.bundle.refuse",
			r.Reason, refuseMeaning[r.Reason])
	}
	return text.Truncate(r.Error(), 1024)
}

var refuseMeaning = map[spiffefed.RefuseReason]string{
	spiffefed.RefuseFetch:     "no answer: connection, TLS, redirect or timeout",
	spiffefed.RefuseStatus:    "a status other than 200",
	spiffefed.RefuseMalformed: "not a SPIFFE bundle",
}

// write replaces ftd's status with st, on the object as ftd was read (a
// conflict means it changed: the worker reads it again). Replacing, not
// applying, so no field another writer put there survives.
func (im *Importer) write(ctx context.Context, ftd *networkingv1alpha1.FederatedTrustDomain, st networkingv1alpha1.FederatedTrustDomainStatus) error {
	st.ObservedGeneration = ftd.Generation
	obj := ftd.DeepCopy()
	obj.Status = st
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		im.log.Error("cannot encode a FederatedTrustDomain's status", "name", ftd.Name, "error", err)
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = im.cfg.Dynamic.Resource(networkingv1alpha1.FederatedTrustDomains).Namespace(ftd.Namespace).
		UpdateStatus(wctx, &unstructured.Unstructured{Object: u}, metav1.UpdateOptions{FieldManager: importFieldManager})
	if apierrors.IsConflict(err) {
		// The informer's copy was behind (often our own last write): the
		// worker decides again soon, on the object as it is then.
		im.log.Debug("a FederatedTrustDomain changed since it was read; deciding again", "name", ftd.Name)
		return err
	}
	if err != nil && ctx.Err() == nil {
		im.log.Warn("could not write a FederatedTrustDomain's status", "name", ftd.Name, "error", err)
	}
	return err
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
		return fmt.Errorf("%w: %w", errCannotCheck, err)
	}
	for _, item := range list.Items {
		var kc multiclusterv1alpha1.KubernetesCluster
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(item.Object, &kc); err != nil {
			return fmt.Errorf("%w: KubernetesCluster %s: %w", errCannotCheck, item.GetName(), err)
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
	if st.TrustDomain != ftd.Spec.TrustDomain || st.BundlePEM == "" ||
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

// bundleKey names b's contents for td: its sequence and its roots.
func bundleKey(td string, b *spiffebundle.Bundle) string {
	seq, ok := b.SequenceNumber()
	return fmt.Sprintf("%s/%d/%t/%s", td, seq, ok, spiffefed.PEM(b.X509Authorities()))
}

// sameBundle: the same sequence (or none in both) and the same roots.
func sameBundle(a, b *spiffebundle.Bundle) bool {
	sa, oka := a.SequenceNumber()
	sb, okb := b.SequenceNumber()
	return oka == okb && sa == sb && spiffefed.SameRoots(a.X509Authorities(), b.X509Authorities())
}

func acceptEvent(ftd *networkingv1alpha1.FederatedTrustDomain, b *spiffebundle.Bundle) audit.Event {
	var fps []string
	for _, c := range spiffefed.SortedRoots(b.X509Authorities()) {
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
