package trust

import (
	"bytes"
	"cmp"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relaymesh/relaymesh/internal/kubeinformers"
	"github.com/relaymesh/relaymesh/internal/pace"
	"github.com/relaymesh/relaymesh/internal/text"

	"github.com/prometheus/client_golang/prometheus"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/federation"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/translation"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// fieldManager owns status.sharedTrust and status.rotation of VirtualMeshes.
const fieldManager = "relaymesh-trust"

// Publisher receives each cluster's trust requests (server.Outputs).
type Publisher interface {
	SetTrust(cluster string, reqs []*relaypb.TrustRequest)
	// TrustVersion is the output version in which cluster's current trust
	// requests were first published.
	TrustVersion(cluster string) uint64
}

// Acks gives the agents' acks of output sets (server.View): a rotation step
// is over once every mesh's agent acked it.
type Acks interface {
	Ack(cluster string) *relaypb.PullAck
	OnAck(func(cluster string))
}

// Config configures a Controller.
type Config struct {
	Dynamic dynamic.Interface
	// ClusterStatus, when set, writes the KubernetesClusters' status
	// (status.trustDomains): the server passes the client its status
	// writer uses, whose rate limiter is its own, so that a cluster's grant
	// verdict does not queue behind the mirror's writes. Nil: Dynamic.
	ClusterStatus dynamic.Interface
	// Informers, when set, are the process's shared informers
	// (kubeinformers.Shared). Nil: the controller watches on its own.
	Informers *kubeinformers.Shared
	Kube      kubernetes.Interface
	// Namespace is the server's: discovered Meshes, and the Secrets of
	// generated roots.
	Namespace string
	Outputs   Publisher
	// Acks: without it, no rotation ever moves past its first step.
	Acks Acks
	// Clusters lists the registered clusters (each gets a set, possibly
	// empty, so agents prune what is no longer asked for).
	Clusters func() []string
	Audit    audit.Recorder
	Logger   *slog.Logger
	Clock    func() time.Time
	// Registerer receives the shared-trust metrics; nil: not exported.
	Registerer prometheus.Registerer
	// ReservedSecrets name Secrets of the server's namespace no VirtualMesh
	// may use as a root or for its credentials (a provided relay CA); the
	// relay CA's own Secrets and generated VirtualMesh roots are always
	// refused.
	ReservedSecrets []string
	// PKCS11Modules are the PKCS#11 modules (absolute paths) a VirtualMesh's
	// rootCA.pkcs11.modulePath may name; none: pkcs11 roots are refused.
	PKCS11Modules []string
	// FederationWait is how long a rotation's new root must have been
	// published at the SPIFFE bundle endpoint before anything is issued
	// from it (AddingNewRoot → PropagatingNewIntermediate): federated
	// peers fetch it within three refresh hints and their own poll
	// period. Zero: the endpoint is off, nothing waits.
	FederationWait time.Duration
	// RootPublished reports since when the bundle endpoint has published
	// root in the bundle of every one of trustDomains, or why not yet.
	// Needed with FederationWait.
	RootPublished func(trustDomains []string, root *x509.Certificate) (since time.Time, err error)
	// ReservedTrustDomains are this Relaymesh's own trust domains besides
	// the meshes' (the relay's): never delivered as a foreign one.
	ReservedTrustDomains []string
	// Leading reports whether this replica holds the server's Lease
	// (lease.Elector.Leading); nil: always (one replica). While it returns
	// false the Controller writes no VirtualMesh status, creates no
	// generated root and never moves a rotation: it publishes and signs
	// from the state the leader recorded in each VirtualMesh's status. Call
	// Kick when it changes.
	Leading func() bool
}

// Controller keeps every member mesh of every VirtualMesh with shared trust
// supplied with an intermediate from the VirtualMesh's root.
type Controller struct {
	cfg     Config
	log     *slog.Logger
	vms     cache.SharedIndexInformer
	mesh    cache.SharedIndexInformer
	kcs     cache.SharedIndexInformer // the registry: KubernetesClusters and their grants
	ftds    cache.SharedIndexInformer // FederatedTrustDomains: foreign roots to deliver
	wake    chan struct{}
	writeMu sync.Mutex // serializes status writes
	mu      sync.Mutex
	state   map[string]*meshTrust // by Mesh object name
	vmst    map[string]*vmState   // by VirtualMesh namespace/name
	cache   map[string]cachedRoot // loaded roots
	used    map[string]bool       // cache keys asked for since the last reconcile
	status  map[string]*networkingv1alpha1.SharedTrustStatus
	written map[string]string // status last written, JSON
	// grantWritten is status.trustDomains last written, by cluster, with
	// the resourceVersion the write made.
	grantWritten map[string]grantWrite
	metrics      *metrics
	// rotating: some VirtualMesh is in a rotation (so acks matter).
	rotating atomic.Bool
	// Leadership (follow.go), under mu.
	led      bool                       // led at the last reconcile
	rv       map[string]string          // resourceVersion vmst[key] was read from or written as
	stale    map[string]bool            // read afresh before the next write
	replaced map[string]map[string]bool // resourceVersions this replica's own writes replaced
	// kickTimer fires at kickWhen, the earliest reconcile kickAt was
	// asked for; nil: none pending.
	kickMu    sync.Mutex
	kickTimer *time.Timer
	kickWhen  time.Time
}

// meshTrust is what the server knows about one mesh with shared trust.
type meshTrust struct {
	cluster string
	vm      string // namespace/name
	vmName  string
	root    *root // nil: held
	cross   *root // signs the intermediate too (req.cross_issuer); nil: none, or held
	ttl     time.Duration
	req     *relaypb.TrustRequest
}

// Start watches VirtualMeshes and Meshes, publishes trust requests after
// every change, and serves SignIntermediate.
func Start(ctx context.Context, cfg Config) (*Controller, error) {
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ClusterStatus == nil {
		cfg.ClusterStatus = cfg.Dynamic
	}
	c := &Controller{cfg: cfg, log: cfg.Logger.With("component", "trust"), wake: make(chan struct{}, 1),
		state: map[string]*meshTrust{}, vmst: map[string]*vmState{}, cache: map[string]cachedRoot{}, used: map[string]bool{}, status: map[string]*networkingv1alpha1.SharedTrustStatus{}, written: map[string]string{},
		rv: map[string]string{}, stale: map[string]bool{}, replaced: map[string]map[string]bool{}, grantWritten: map[string]grantWrite{}}
	shared := cfg.Informers.OrNew(cfg.Dynamic, cfg.Namespace)
	users, discovered := shared.All, shared.Local
	c.vms = users.ForResource(networkingv1alpha1.VirtualMeshes).Informer()
	c.mesh = discovered.ForResource(discoveryv1alpha1.Meshes).Informer()
	c.kcs = discovered.ForResource(multiclusterv1alpha1.KubernetesClusters).Informer()
	// Not waited for below: without the CRD (an upgrade that did not
	// apply it) shared trust works on, and what status.sharedTrust.federation
	// records stays delivered (foreignRoots).
	c.ftds = discovered.ForResource(networkingv1alpha1.FederatedTrustDomains).Informer()
	h := cache.ResourceEventHandlerFuncs{AddFunc: func(any) { c.Kick() }, UpdateFunc: func(any, any) { c.Kick() }, DeleteFunc: func(any) { c.Kick() }}
	for _, inf := range []cache.SharedIndexInformer{c.vms, c.mesh} {
		if _, err := inf.AddEventHandler(h); err != nil {
			return nil, err
		}
	}
	// A KubernetesCluster's status changes with every agent heartbeat; only
	// its spec (the grant) matters here, and to the leader
	// status.trustDomains, which writeGrantStatuses compares with what it
	// would write (a new leader is kicked at its term's start).
	if _, err := c.kcs.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(any) { c.Kick() }, DeleteFunc: func(any) { c.Kick() },
		UpdateFunc: func(o, n any) {
			om, ok := o.(metav1.Object)
			nm, ok2 := n.(metav1.Object)
			if ok && ok2 && om.GetGeneration() == nm.GetGeneration() && om.GetGeneration() != 0 &&
				(!c.leading() || sameTrustDomainsOf(o, n)) {
				return
			}
			c.Kick()
		}}); err != nil {
		return nil, err
	}
	// A FederatedTrustDomain's status changes with every fetch; only its
	// accepted bundle matters here.
	if _, err := c.ftds.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(any) { c.Kick() }, DeleteFunc: func(any) { c.Kick() },
		UpdateFunc: func(o, n any) {
			if !sameAcceptedBundle(o, n) {
				c.Kick()
			}
		}}); err != nil {
		return nil, err
	}
	var err error
	if c.metrics, err = newMetrics(cfg.Registerer); err != nil {
		return nil, err
	}
	if cfg.Acks != nil {
		// Acks matter only to a rotation waiting for them; every output
		// set an agent applies is acked, so the rest of the time they
		// would only make reconciles.
		cfg.Acks.OnAck(func(string) {
			if c.rotating.Load() {
				c.Kick()
			}
		})
	}
	shared.Start(ctx.Done())
	syncCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), c.vms.HasSynced, c.mesh.HasSynced, c.kcs.HasSynced) {
		return nil, errors.New("trust: VirtualMesh, Mesh and KubernetesCluster watches did not sync within a minute")
	}
	c.reconcile(ctx)
	go func() {
		// A change waits 100 ms for others, and the next reconcile starts
		// no sooner than the last took after it ended (at most 5 s): a
		// reconcile reads every cluster, and in a bootstrap storm each
		// cluster's new Mesh wakes one, so at 10,000 clusters they ran
		// back to back (issue 31; docs/design/2026-12-06-storm-pacing.md).
		pacer := pace.Pacer{Gather: 100 * time.Millisecond, Debounce: 100 * time.Millisecond, Cap: pace.DefaultCap}
		for {
			select {
			case <-ctx.Done():
				return
			case <-c.wake:
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(pacer.Wait(time.Now())):
			}
			start := time.Now()
			c.reconcile(ctx)
			pacer.Ran(start, time.Now())
		}
	}()
	return c, nil
}

// Kick asks for a reconcile (e.g. when a cluster registers, or this replica
// started or stopped leading).
func (c *Controller) Kick() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func listTyped[T any](inf cache.SharedIndexInformer) ([]T, error) {
	var out []T
	for _, o := range inf.GetStore().List() {
		t, err := kubeinformers.As[T](o)
		if err != nil {
			return nil, err
		}
		if t != nil {
			out = append(out, *t)
		}
	}
	return out, nil
}

// reconcile decides every mesh's trust request, publishes them, and moves
// rotations whose step every agent acked.
func (c *Controller) reconcile(ctx context.Context) {
	vms, err := listTyped[networkingv1alpha1.VirtualMesh](c.vms)
	var meshes []discoveryv1alpha1.Mesh
	if err == nil {
		meshes, err = listTyped[discoveryv1alpha1.Mesh](c.mesh)
	}
	var clusters []multiclusterv1alpha1.KubernetesCluster
	if err == nil {
		clusters, err = listTyped[multiclusterv1alpha1.KubernetesCluster](c.kcs)
	}
	if err != nil {
		// Keep what was published: a hole in the view must not make agents
		// delete their CAs.
		c.log.Error("not reconciling shared trust; the published requests stay", "error", err)
		return
	}
	leading := c.observeLeadership()
	plans := c.decide(ctx, &translation.Input{VirtualMeshes: vms, Meshes: meshes, Clusters: clusters}, leading)
	// Before anything is published: an ack of it must not be missed.
	rotating := false
	c.mu.Lock()
	for _, p := range plans {
		if st := c.vmst[p.key]; st != nil && active(st.rotation) {
			rotating = true
		}
	}
	c.mu.Unlock()
	c.rotating.Store(rotating)
	byCluster := map[string][]*relaypb.TrustRequest{}
	for _, name := range c.cfg.Clusters() {
		byCluster[name] = nil
	}
	members := map[string][]*meshTrust{}
	c.mu.Lock()
	for _, mt := range c.state {
		byCluster[mt.cluster] = append(byCluster[mt.cluster], mt.req)
		members[mt.vm] = append(members[mt.vm], mt)
	}
	c.mu.Unlock()
	setAll := func() {
		for cl, reqs := range byCluster {
			c.cfg.Outputs.SetTrust(cl, reqs)
		}
	}
	// A rotation step changes every member cluster's set: the head writer
	// (server.Outputs) hears of them in one burst.
	if b, ok := c.cfg.Outputs.(interface{ Batch(func()) }); ok {
		b.Batch(setAll)
	} else {
		setAll()
	}
	moved := false
	if leading {
		for _, p := range plans {
			moved = c.advance(ctx, p, members[p.key]) || moved
		}
		for _, p := range plans {
			c.writeStatus(ctx, p.key)
		}
		c.writeGrantStatuses(ctx, clusters, grantStatuses(clusters, meshes))
	}
	c.dropUnused()
	c.mu.Lock()
	states := map[string]*vmState{}
	issued := map[string][]networkingv1alpha1.MeshCAStatus{}
	for _, p := range plans {
		states[p.key] = c.vmst[p.key]
		if st := c.status[p.key]; st != nil {
			issued[p.key] = slices.Clone(st.Meshes)
		}
	}
	c.mu.Unlock()
	c.metrics.observe(plans, states, issued)
	if moved {
		c.Kick()
	}
}

// decide computes every mesh's request from the VirtualMeshes that are
// valid (the same decision translation makes) and ask for shared trust.
func (c *Controller) decide(ctx context.Context, in *translation.Input, leading bool) []*vmPlan {
	// Sorted before the plan is made: the plan keeps pointers into the
	// list, and sorting it afterwards gave one VirtualMesh another's
	// verdict and members (an Invalid one then issued intermediates).
	slices.SortFunc(in.VirtualMeshes, func(a, b networkingv1alpha1.VirtualMesh) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	plan := federation.NewPlan(in)
	fi := &foreignInputs{in: in}
	state := map[string]*meshTrust{}
	var plans []*vmPlan
	seen := map[string]bool{}
	meshByName := map[string]*discoveryv1alpha1.Mesh{}
	for i := range in.Meshes {
		meshByName[in.Meshes[i].Name] = &in.Meshes[i]
	}
	for i := range in.VirtualMeshes {
		vm := &in.VirtualMeshes[i]
		shared := vm.Spec.MTLS
		if shared == nil || shared.Shared == nil {
			continue
		}
		key := vm.Namespace + "/" + vm.Name
		members, ok := plan.Members(vm.Namespace, vm.Name)
		if !ok {
			// Invalid (its status says why), e.g. a mesh named before it is
			// discovered: the meshes it had keep their CAs as they are.
			for _, mt := range c.heldWhileInvalid(key, vm, meshByName) {
				state[mt.req.GetMesh()] = mt
			}
			c.mu.Lock()
			seen[key] = seen[key] || c.vmst[key] != nil
			c.mu.Unlock()
			continue
		}
		p := c.plan(ctx, vm, leading, AmbientMembers(members))
		if p.bundle == nil && !p.hold {
			continue
		}
		c.federate(ctx, p, leading, fi)
		seen[p.key] = true
		plans = append(plans, p)
		ttl := defaultIntermediateTTL
		opts := shared.Shared.IntermediateOptions
		for _, m := range members {
			ist := m.Spec.Istio
			// The trust domain is the one discovery reported for the mesh;
			// federation already refused a VirtualMesh in which a member's
			// is outside its cluster's grant, or two members claim one
			// without spec.mtls.trustDomains: Shared.
			req := &relaypb.TrustRequest{Mesh: m.Name, Namespace: ist.Installation.Namespace, VirtualMesh: p.key, TrustDomain: ist.TrustDomain}
			if p.hold {
				req.Hold = true
			} else {
				req.RootBundle, req.Issuer, req.RenewAtPercent, req.RestartPods = p.bundle, p.issuer, defaultRenewAtPercent, shared.AutoRestartPods
				req.CrossIssuer, req.CrossRoot = p.crossIssuer, p.crossRoot
				if opts != nil {
					req.RenewAtPercent = cmp.Or(opts.RenewAtPercent, int32(defaultRenewAtPercent))
					req.KeyAlgorithm = string(opts.KeyAlgorithm)
					if opts.TTL != nil && opts.TTL.Duration > 0 {
						ttl = opts.TTL.Duration
					}
				}
			}
			state[m.Name] = &meshTrust{cluster: ist.Installation.Cluster, vm: p.key, vmName: vm.Name, root: p.signer, cross: p.cross, ttl: ttl, req: req}
		}
	}
	c.mu.Lock()
	c.state = state
	for key := range c.status {
		if !seen[key] {
			delete(c.status, key)
		}
	}
	for key := range c.vmst {
		if !seen[key] {
			delete(c.vmst, key)
			delete(c.rv, key)
			delete(c.stale, key)
			delete(c.replaced, key)
		}
	}
	for key := range c.written {
		if !seen[key] {
			// A VirtualMesh made again under the same name gets its status.
			delete(c.written, key)
		}
	}
	for key := range seen {
		if c.status[key] == nil {
			c.status[key] = &networkingv1alpha1.SharedTrustStatus{}
		}
	}
	for _, p := range plans {
		key := p.key
		st := c.status[key]
		if st == nil {
			// A restarted server starts from what the status says was issued.
			st = &networkingv1alpha1.SharedTrustStatus{}
			if prev := p.vm.Status.SharedTrust; prev != nil {
				st.Meshes = slices.Clone(prev.Meshes)
			}
			c.status[key] = st
		}
		// Meshes that left the VirtualMesh leave its status.
		st.Meshes = slices.DeleteFunc(st.Meshes, func(m networkingv1alpha1.MeshCAStatus) bool {
			mt := state[m.Mesh]
			return mt == nil || mt.vm != key
		})
	}
	c.mu.Unlock()
	return plans
}

// heldWhileInvalid returns hold requests for the meshes an Invalid
// VirtualMesh had: those published for it before, else (a restarted server)
// those its status says were issued intermediates.
func (c *Controller) heldWhileInvalid(key string, vm *networkingv1alpha1.VirtualMesh, meshes map[string]*discoveryv1alpha1.Mesh) []*meshTrust {
	var out []*meshTrust
	hold := func(mesh, cluster, namespace string) {
		out = append(out, &meshTrust{cluster: cluster, vm: key, vmName: vm.Name,
			req: &relaypb.TrustRequest{Mesh: mesh, Namespace: namespace, VirtualMesh: key, Hold: true}})
	}
	c.mu.Lock()
	for name, mt := range c.state {
		if mt.vm == key {
			hold(name, mt.cluster, mt.req.GetNamespace())
		}
	}
	c.mu.Unlock()
	if len(out) > 0 || vm.Status.SharedTrust == nil {
		return out
	}
	for _, m := range vm.Status.SharedTrust.Meshes {
		if mesh := meshes[m.Mesh]; mesh != nil && mesh.Spec.Istio != nil && mesh.Spec.Istio.Installation.Cluster == m.Cluster {
			hold(m.Mesh, m.Cluster, mesh.Spec.Istio.Installation.Namespace)
		}
	}
	return out
}

// statusBody is the status patch of key for state st. Callers hold c.mu.
func (c *Controller) statusBody(key string, st *vmState) ([]byte, error) {
	shared := networkingv1alpha1.SharedTrustStatus{}
	if cur := c.status[key]; cur != nil {
		shared.Meshes = cur.Meshes
	}
	if st.inForce != nil {
		shared.Root, shared.RootFingerprint, shared.RootSubject = st.inForce, st.fp, st.subject
		if !st.notAfter.IsZero() {
			na := metav1.NewTime(st.notAfter)
			shared.RootNotAfter = &na
		}
	}
	shared.Message = st.message
	shared.Federation = st.federation
	ns, name, _ := strings.Cut(key, "/")
	status := map[string]any{"sharedTrust": shared}
	if st.rotation != nil {
		status["rotation"] = st.rotation
	}
	// Applied (server-side apply): a field this controller set before and
	// leaves out now is removed, which a merge patch of omitempty fields
	// would never do.
	return json.Marshal(map[string]any{"apiVersion": networkingv1alpha1.GroupVersion.String(), "kind": "VirtualMesh",
		"metadata": map[string]any{"name": name, "namespace": ns}, "status": status})
}

// writeStatus patches status.sharedTrust and status.rotation of a
// VirtualMesh when they changed; only the leader does.
func (c *Controller) writeStatus(ctx context.Context, key string) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if !c.leading() {
		return
	}
	c.mu.Lock()
	st := c.vmst[key]
	if st == nil || st.inForce == nil {
		c.mu.Unlock()
		return
	}
	body, err := c.statusBody(key, st)
	c.mu.Unlock()
	if err != nil {
		return
	}
	if err := c.patchStatus(ctx, key, body); err != nil && !errors.Is(err, errStale) {
		c.log.Warn("could not write the VirtualMesh's trust status", "virtual_mesh", key, "error", err)
	}
}

// errStale: a status write was refused because the VirtualMesh changed
// since its state was read; the next reconcile reads it afresh.
var errStale = errors.New("the VirtualMesh changed since its state was read")

// maxReplaced bounds the resourceVersions remembered as replaced by this
// replica's own writes, per VirtualMesh.
const maxReplaced = 16

// patchStatus writes body unless it is what was written last, on condition
// that the VirtualMesh is still at the resourceVersion key's state was read
// from or last written as (follow.go). Only the leader writes. Callers hold
// c.writeMu.
func (c *Controller) patchStatus(ctx context.Context, key string, body []byte) error {
	c.mu.Lock()
	same := c.written[key] == string(body)
	rv, stale := c.rv[key], c.stale[key]
	c.mu.Unlock()
	if same {
		return nil
	}
	if !c.leading() {
		return errNotLeading
	}
	if rv == "" || stale {
		return errStale
	}
	req, err := conditional(body, rv)
	if err != nil {
		return err
	}
	ns, name, _ := strings.Cut(key, "/")
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := c.cfg.Dynamic.Resource(networkingv1alpha1.VirtualMeshes).Namespace(ns).
		Patch(wctx, name, types.ApplyPatchType, req, metav1.PatchOptions{FieldManager: fieldManager, Force: new(true)}, "status")
	if apierrors.IsConflict(err) {
		c.mu.Lock()
		c.stale[key] = true
		c.mu.Unlock()
		c.log.Info("the VirtualMesh changed since its state was read; reading it afresh", "virtual_mesh", key)
		c.Kick()
		return fmt.Errorf("%w: %w", errStale, err)
	}
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.written[key] = string(body)
	c.rv[key] = res.GetResourceVersion()
	if c.replaced[key] == nil {
		c.replaced[key] = map[string]bool{}
	}
	if len(c.replaced[key]) >= maxReplaced {
		clear(c.replaced[key])
	}
	c.replaced[key][rv] = true
	c.mu.Unlock()
	return nil
}

// recordIssued puts an issued intermediate into its VirtualMesh's status.
func (c *Controller) recordIssued(mt *meshTrust, mesh string, cert *x509.Certificate) {
	c.mu.Lock()
	st := c.status[mt.vm]
	if st == nil {
		c.mu.Unlock()
		return
	}
	entry := networkingv1alpha1.MeshCAStatus{Mesh: mesh, Cluster: mt.cluster, TrustDomain: mt.req.GetTrustDomain(), Serial: cert.SerialNumber.Text(16),
		NotBefore: metav1.NewTime(cert.NotBefore), NotAfter: metav1.NewTime(cert.NotAfter), Issuer: mt.req.GetIssuer()}
	if i := slices.IndexFunc(st.Meshes, func(m networkingv1alpha1.MeshCAStatus) bool { return m.Mesh == mesh }); i >= 0 {
		st.Meshes[i] = entry
	} else {
		st.Meshes = append(st.Meshes, entry)
		slices.SortFunc(st.Meshes, func(a, b networkingv1alpha1.MeshCAStatus) int { return strings.Compare(a.Mesh, b.Mesh) })
	}
	c.mu.Unlock()
	// The next reconcile writes it: a signing never waits for a status
	// write.
	c.Kick()
}

// SignIntermediate signs an intermediate for a mesh of cluster (the caller's,
// from its certificate).
func (c *Controller) SignIntermediate(ctx context.Context, cluster string, req *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
	c.mu.Lock()
	mt := c.state[req.GetMesh()]
	c.mu.Unlock()
	deny := func(code codes.Code, reason string) error {
		_ = c.cfg.Audit.Record(audit.Event{Type: audit.CertDeny, Result: audit.ResultFailure, Cluster: cluster, Reason: reason,
			Details: map[string]string{"kind": "intermediate", "mesh": text.Truncate(req.GetMesh(), 253)}})
		return status.Error(code, reason)
	}
	if mt == nil {
		return nil, deny(codes.FailedPrecondition, "the mesh has no shared trust: it is unknown or in no valid VirtualMesh with spec.mtls.shared")
	}
	if mt.cluster != cluster {
		return nil, deny(codes.PermissionDenied, "the mesh is not in the caller's cluster")
	}
	if mt.root == nil || (mt.req.GetCrossIssuer() != "" && mt.cross == nil) {
		return nil, deny(codes.Unavailable, "the VirtualMesh's root cannot be used now; the mesh keeps its CA (see the VirtualMesh's status.sharedTrust.message)")
	}
	// The last word before signing: the registry and the mesh as they are
	// now, not as the last reconcile saw them.
	if err := c.authorizeNow(cluster, req.GetMesh(), mt.req.GetTrustDomain()); err != nil {
		return nil, deny(codes.PermissionDenied, "intermediate not issued: "+err.Error())
	}
	csr, err := ca.ParseIntermediateCSR(req.GetCsr())
	if err != nil {
		return nil, deny(codes.InvalidArgument, err.Error())
	}
	issueReq := ca.IntermediateRequest{VirtualMesh: mt.vmName, Mesh: req.GetMesh(), TrustDomain: mt.req.GetTrustDomain(), TTL: mt.ttl}
	cert, err := mt.root.issue(ctx, csr, issueReq)
	var cross *x509.Certificate
	if err == nil && mt.req.GetCrossIssuer() != "" {
		// The same CSR, so the same subject and key: the leaves the
		// intermediate's key signs verify through either certificate.
		cross, err = mt.cross.issue(ctx, csr, issueReq)
		if err == nil && (!bytes.Equal(cross.RawSubject, cert.RawSubject) || !bytes.Equal(cross.SubjectKeyId, cert.SubjectKeyId)) {
			err = errors.New("the two roots' signers made intermediates of different subjects or key identifiers: a leaf would name only one of them")
		}
	}
	switch {
	case errors.Is(err, ca.ErrInvalidCSR) || errors.Is(err, ca.ErrKeyPolicy):
		// The caller's request is at fault (a foreign subject, other name
		// constraints): its error, not ours.
		return nil, deny(codes.InvalidArgument, "intermediate not issued: "+err.Error())
	case err != nil:
		return nil, deny(codes.Internal, "intermediate not issued: "+err.Error())
	}
	for _, iss := range []*x509.Certificate{cert, cross} {
		if iss == nil {
			continue
		}
		details := map[string]string{"kind": "intermediate", "mesh": req.GetMesh(), "virtualMesh": mt.vm, "notAfter": iss.NotAfter.UTC().Format(time.RFC3339)}
		if iss == cross {
			details["kind"], details["crossIssuer"] = "intermediate-cross", mt.req.GetCrossIssuer()
		}
		if err := c.cfg.Audit.Record(audit.Event{Type: audit.CertIssue, Result: audit.ResultSuccess, Cluster: cluster,
			Serial: iss.SerialNumber.Text(16), Details: details}); err != nil {
			return nil, status.Error(codes.Unavailable, "the issuance could not be audited; not issued")
		}
	}
	c.recordIssued(mt, req.GetMesh(), cert)
	chain := append([]*x509.Certificate{cert}, mt.root.chain()...)
	resp := &relaypb.IntermediateResponse{CertificateChain: ca.CertsPEM(chain...), RootBundle: mt.req.GetRootBundle(), Issuer: mt.req.GetIssuer()}
	if cross != nil {
		resp.CrossCertificateChain = ca.CertsPEM(append([]*x509.Certificate{cross}, mt.cross.chain()...)...)
	}
	return resp, nil
}

// authorizeNow is authorizeSigning against the watches' current view of
// the registry and of the mesh. Without the watches nothing is authorized.
func (c *Controller) authorizeNow(cluster, mesh, td string) error {
	if c.kcs == nil || c.mesh == nil {
		return fmt.Errorf("%w: the registry is not watched", ErrTrustDomainRefused)
	}
	clusters, err := listTyped[multiclusterv1alpha1.KubernetesCluster](c.kcs)
	if err != nil {
		return fmt.Errorf("%w: the registry cannot be read: %w", ErrTrustDomainRefused, err)
	}
	var m *discoveryv1alpha1.Mesh
	if obj, ok, err := c.mesh.GetStore().GetByKey(c.cfg.Namespace + "/" + mesh); err == nil && ok {
		m, _ = kubeinformers.As[discoveryv1alpha1.Mesh](obj)
	}
	return authorizeSigning(clusters, m, cluster, td)
}

// trustDomainsOf is u's status.trustDomains as the watch decoded it (nil
// when there is none).
func trustDomainsOf(u *unstructured.Unstructured) any {
	v, _, _ := unstructured.NestedFieldNoCopy(u.Object, "status", "trustDomains")
	return v
}

// sameTrustDomainsOf reports whether two versions of a watched
// KubernetesCluster show the same status.trustDomains: typed (the cache is,
// kubeinformers.Typed) or as read.
func sameTrustDomainsOf(o, n any) bool {
	switch o := o.(type) {
	case *multiclusterv1alpha1.KubernetesCluster:
		n, ok := n.(*multiclusterv1alpha1.KubernetesCluster)
		return ok && sameTrustDomains(o.Status.TrustDomains, n.Status.TrustDomains)
	case *unstructured.Unstructured:
		n, ok := n.(*unstructured.Unstructured)
		return ok && reflect.DeepEqual(trustDomainsOf(o), trustDomainsOf(n))
	}
	return false
}

// sameTrustDomains: a and b are the same statuses, in order (nil and
// empty alike).
func sameTrustDomains(a, b []multiclusterv1alpha1.TrustDomainStatus) bool {
	return slices.EqualFunc(a, b, func(x, y multiclusterv1alpha1.TrustDomainStatus) bool {
		return x.Name == y.Name && x.State == y.State && x.Message == y.Message && slices.Equal(x.Meshes, y.Meshes)
	})
}

// writeGrantStatuses applies status.trustDomains of every cluster whose
// status does not show its verdict; only the leader does. A verdict the
// status already shows is not written again: a new Lease holder or a
// restarted server would otherwise apply every cluster's status, a fleet's
// worth of writes for nothing. A failed write is tried again at the next
// reconcile.
func (c *Controller) writeGrantStatuses(ctx context.Context, clusters []multiclusterv1alpha1.KubernetesCluster, sts map[string][]multiclusterv1alpha1.TrustDomainStatus) {
	shown := make(map[string][]multiclusterv1alpha1.TrustDomainStatus, len(clusters))
	shownRV := make(map[string]string, len(clusters))
	for _, kc := range clusters {
		shown[kc.Name], shownRV[kc.Name] = kc.Status.TrustDomains, kc.ResourceVersion
	}
	c.mu.Lock()
	for name := range c.grantWritten {
		if _, ok := sts[name]; !ok {
			delete(c.grantWritten, name) // deregistered: a new registration gets its status
		}
	}
	c.mu.Unlock()
	if !c.leading() {
		return
	}
	var writes []grantWrite
	for _, name := range slices.Sorted(maps.Keys(sts)) {
		if sameTrustDomains(sts[name], shown[name]) {
			continue
		}
		status := map[string]any{}
		if len(sts[name]) > 0 {
			status["trustDomains"] = sts[name]
		}
		body, err := json.Marshal(map[string]any{"apiVersion": multiclusterv1alpha1.GroupVersion.String(), "kind": "KubernetesCluster",
			"metadata": map[string]any{"name": name, "namespace": c.cfg.Namespace}, "status": status})
		if err != nil {
			continue
		}
		c.mu.Lock()
		w, wrote := c.grantWritten[name]
		c.mu.Unlock()
		if wrote && w.body == string(body) {
			// This body was written, and the watch shows that write (the
			// same body again would change nothing: fields of other
			// managers stay) or not yet: looked at again in a while, in
			// case the watch skips to a later version with the same
			// trustDomains (no change to kick a reconcile). Shown a later
			// version, someone wrote since: written again.
			if later, err := resourceversion.CompareResourceVersion(shownRV[name], w.rv); err != nil || later <= 0 {
				if later < 0 {
					c.kickAt(time.Now().Add(staleRetry), staleRetry)
				}
				continue
			}
		}
		writes = append(writes, grantWrite{cluster: name, body: string(body)})
	}
	// A few at once: one at a time, a fleet's verdicts (a write a cluster
	// when it is registered, another once its mesh is mirrored) took over
	// a minute at 1,000 clusters, the reconcile (and so a rotation's next
	// step) waiting, the tail landing among the first policy edits'
	// writes. Not many more: these share the session status writer's
	// budget.
	var g errgroup.Group
	g.SetLimit(grantWriters)
	for _, w := range writes {
		g.Go(func() error {
			if !c.leading() {
				return nil
			}
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			res, err := c.cfg.ClusterStatus.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(c.cfg.Namespace).
				Patch(wctx, w.cluster, types.ApplyPatchType, []byte(w.body), metav1.PatchOptions{FieldManager: fieldManager, Force: new(true)}, "status")
			cancel()
			switch {
			case apierrors.IsNotFound(err):
				return nil // deregistered meanwhile
			case err != nil:
				c.log.Warn("could not write the cluster's trust domain status", "cluster", w.cluster, "error", err)
				return nil
			}
			w.rv = res.GetResourceVersion()
			c.mu.Lock()
			c.grantWritten[w.cluster] = w
			c.mu.Unlock()
			return nil
		})
	}
	_ = g.Wait() // every write returns nil: a failed one is tried at the next reconcile
}

// grantWriters is how many status.trustDomains writes are in flight at once.
const grantWriters = 4

// grantWrite is a status.trustDomains this replica wrote, and the
// resourceVersion its write returned (in writeGrantStatuses' list of
// writes to make, before the write, rv is empty; grantWritten holds only
// writes that returned).
type grantWrite struct{ cluster, body, rv string }
