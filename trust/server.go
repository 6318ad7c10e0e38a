package trust

import (
	"cmp"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/federation"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/translation"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Publisher receives each cluster's trust requests (relay.Outputs).
type Publisher interface {
	SetTrust(cluster string, reqs []*relaypb.TrustRequest)
}

// Config configures a Controller.
type Config struct {
	Dynamic dynamic.Interface
	Kube    kubernetes.Interface
	// Namespace is the server's: discovered Meshes, and the Secrets of
	// generated roots.
	Namespace string
	Outputs   Publisher
	// Clusters lists the registered clusters (each gets a set, possibly
	// empty, so agents prune what is no longer asked for).
	Clusters func() []string
	Audit    audit.Recorder
	Logger   *slog.Logger
	Clock    func() time.Time
	// PKCS11Modules are the PKCS#11 modules (absolute paths) a VirtualMesh's
	// rootCA.pkcs11.modulePath may name; none: pkcs11 roots are refused.
	PKCS11Modules []string
}

// Controller keeps every member mesh of every VirtualMesh with shared trust
// supplied with an intermediate from the VirtualMesh's root.
type Controller struct {
	cfg     Config
	log     *slog.Logger
	vms     cache.SharedIndexInformer
	mesh    cache.SharedIndexInformer
	wake    chan struct{}
	mu      sync.Mutex
	state   map[string]*meshTrust // by Mesh object name
	roots   map[string]*root      // by VirtualMesh namespace/name
	status  map[string]*networkingv1alpha1.SharedTrustStatus
	written map[string]string // status last written, JSON
}

// meshTrust is what the server knows about one mesh with shared trust.
type meshTrust struct {
	cluster string
	vm      string // namespace/name
	root    *root
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
	c := &Controller{cfg: cfg, log: cfg.Logger.With("component", "trust"), wake: make(chan struct{}, 1),
		state: map[string]*meshTrust{}, roots: map[string]*root{}, status: map[string]*networkingv1alpha1.SharedTrustStatus{}, written: map[string]string{}}
	users := dynamicinformer.NewDynamicSharedInformerFactory(cfg.Dynamic, 10*time.Minute)
	discovered := dynamicinformer.NewFilteredDynamicSharedInformerFactory(cfg.Dynamic, 10*time.Minute, cfg.Namespace, nil)
	c.vms = users.ForResource(networkingv1alpha1.GroupVersion.WithResource("virtualmeshes")).Informer()
	c.mesh = discovered.ForResource(discoveryv1alpha1.GroupVersion.WithResource("meshes")).Informer()
	h := cache.ResourceEventHandlerFuncs{AddFunc: func(any) { c.Kick() }, UpdateFunc: func(any, any) { c.Kick() }, DeleteFunc: func(any) { c.Kick() }}
	for _, inf := range []cache.SharedIndexInformer{c.vms, c.mesh} {
		if _, err := inf.AddEventHandler(h); err != nil {
			return nil, err
		}
	}
	users.Start(ctx.Done())
	discovered.Start(ctx.Done())
	syncCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), c.vms.HasSynced, c.mesh.HasSynced) {
		return nil, errors.New("trust: VirtualMesh and Mesh watches did not sync within a minute")
	}
	c.reconcile(ctx)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-c.wake:
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			c.reconcile(ctx)
		}
	}()
	return c, nil
}

// Kick asks for a reconcile (e.g. when a cluster registers).
func (c *Controller) Kick() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func listTyped[T any](inf cache.SharedIndexInformer) ([]T, error) {
	var out []T
	for _, o := range inf.GetStore().List() {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		var t T
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &t); err != nil {
			return nil, fmt.Errorf("%s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
		}
		out = append(out, t)
	}
	return out, nil
}

// reconcile decides every mesh's trust request and publishes them.
func (c *Controller) reconcile(ctx context.Context) {
	vms, err := listTyped[networkingv1alpha1.VirtualMesh](c.vms)
	if err == nil {
		var meshes []discoveryv1alpha1.Mesh
		meshes, err = listTyped[discoveryv1alpha1.Mesh](c.mesh)
		if err == nil {
			c.decide(ctx, &translation.Input{VirtualMeshes: vms, Meshes: meshes})
		}
	}
	if err != nil {
		// Keep what was published: a hole in the view must not make agents
		// delete their CAs.
		c.log.Error("not reconciling shared trust; the published requests stay", "error", err)
		return
	}
	byCluster := map[string][]*relaypb.TrustRequest{}
	for _, name := range c.cfg.Clusters() {
		byCluster[name] = nil
	}
	c.mu.Lock()
	for _, mt := range c.state {
		byCluster[mt.cluster] = append(byCluster[mt.cluster], mt.req)
	}
	c.mu.Unlock()
	for cl, reqs := range byCluster {
		c.cfg.Outputs.SetTrust(cl, reqs)
	}
}

// decide computes the state from the VirtualMeshes that are valid (the same
// decision translation makes) and ask for shared trust.
func (c *Controller) decide(ctx context.Context, in *translation.Input) {
	plan := federation.NewPlan(in)
	state := map[string]*meshTrust{}
	roots := map[string]*root{}
	slices.SortFunc(in.VirtualMeshes, func(a, b networkingv1alpha1.VirtualMesh) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	for i := range in.VirtualMeshes {
		vm := &in.VirtualMeshes[i]
		shared := vm.Spec.MTLS
		if shared == nil || shared.Shared == nil {
			continue
		}
		members, ok := plan.Members(vm.Namespace, vm.Name)
		if !ok {
			continue // Invalid: its status says why; its meshes keep what they have
		}
		key := vm.Namespace + "/" + vm.Name
		r, err := c.root(ctx, vm)
		if err != nil {
			c.log.Error("VirtualMesh root unavailable; its meshes keep their current CAs", "virtual_mesh", key, "error", err)
			// Keep the previous requests of its meshes.
			c.mu.Lock()
			for name, mt := range c.state {
				if mt.vm == key {
					state[name] = mt
				}
			}
			if old := c.roots[key]; old != nil {
				roots[key] = old
			}
			c.mu.Unlock()
			continue
		}
		roots[key] = r
		opts := shared.Shared.IntermediateOptions
		for _, m := range members {
			ist := m.Spec.Istio
			req := &relaypb.TrustRequest{Mesh: m.Name, Namespace: ist.Installation.Namespace, VirtualMesh: key,
				RootBundle: r.bundle, Issuer: r.fingerprint, RenewAtPercent: defaultRenewAtPercent}
			if opts != nil {
				req.RenewAtPercent = cmp.Or(opts.RenewAtPercent, int32(defaultRenewAtPercent))
				req.KeyAlgorithm = string(opts.KeyAlgorithm)
			}
			state[m.Name] = &meshTrust{cluster: ist.Installation.Cluster, vm: key, root: r, req: req}
		}
	}
	c.mu.Lock()
	c.state, c.roots = state, roots
	keys := make([]string, 0, len(roots))
	for key, r := range roots {
		st := c.status[key]
		if st == nil || st.RootFingerprint != r.fingerprint {
			root := verifyingRoot(r.signer)
			na := metav1.NewTime(root.NotAfter)
			st = &networkingv1alpha1.SharedTrustStatus{RootFingerprint: r.fingerprint, RootSubject: root.Subject.String(), RootNotAfter: &na}
			c.status[key] = st
		}
		// Meshes that left the VirtualMesh leave its status.
		st.Meshes = slices.DeleteFunc(st.Meshes, func(m networkingv1alpha1.MeshCAStatus) bool {
			mt := state[m.Mesh]
			return mt == nil || mt.vm != key
		})
		keys = append(keys, key)
	}
	for key := range c.status {
		if roots[key] == nil {
			delete(c.status, key)
		}
	}
	c.mu.Unlock()
	for _, key := range keys {
		c.writeStatus(ctx, key)
	}
}

// writeStatus patches status.sharedTrust of a VirtualMesh when it changed.
func (c *Controller) writeStatus(ctx context.Context, key string) {
	c.mu.Lock()
	st := c.status[key]
	if st == nil {
		c.mu.Unlock()
		return
	}
	body, err := json.Marshal(map[string]any{"status": map[string]any{"sharedTrust": st}})
	if err != nil || c.written[key] == string(body) {
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	ns, name, _ := strings.Cut(key, "/")
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = c.cfg.Dynamic.Resource(networkingv1alpha1.GroupVersion.WithResource("virtualmeshes")).Namespace(ns).
		Patch(wctx, name, types.MergePatchType, body, metav1.PatchOptions{}, "status")
	if err != nil {
		c.log.Warn("could not write status.sharedTrust", "virtual_mesh", key, "error", err)
		return
	}
	c.mu.Lock()
	c.written[key] = string(body)
	c.mu.Unlock()
}

// recordIssued puts an issued intermediate into its VirtualMesh's status.
func (c *Controller) recordIssued(ctx context.Context, mt *meshTrust, mesh string, cert *x509.Certificate) {
	c.mu.Lock()
	st := c.status[mt.vm]
	if st == nil {
		c.mu.Unlock()
		return
	}
	entry := networkingv1alpha1.MeshCAStatus{Mesh: mesh, Cluster: mt.cluster, Serial: cert.SerialNumber.Text(16),
		NotBefore: metav1.NewTime(cert.NotBefore), NotAfter: metav1.NewTime(cert.NotAfter), Issuer: mt.req.GetIssuer()}
	if i := slices.IndexFunc(st.Meshes, func(m networkingv1alpha1.MeshCAStatus) bool { return m.Mesh == mesh }); i >= 0 {
		st.Meshes[i] = entry
	} else {
		st.Meshes = append(st.Meshes, entry)
		slices.SortFunc(st.Meshes, func(a, b networkingv1alpha1.MeshCAStatus) int { return strings.Compare(a.Mesh, b.Mesh) })
	}
	c.mu.Unlock()
	c.writeStatus(ctx, mt.vm)
}

// SignIntermediate signs an intermediate for a mesh of cluster (the caller's,
// from its certificate).
func (c *Controller) SignIntermediate(ctx context.Context, cluster string, req *relaypb.IntermediateRequest) (*relaypb.IntermediateResponse, error) {
	c.mu.Lock()
	mt := c.state[req.GetMesh()]
	c.mu.Unlock()
	deny := func(code codes.Code, reason string) error {
		_ = c.cfg.Audit.Record(audit.Event{Type: audit.CertDeny, Result: audit.ResultFailure, Cluster: cluster, Reason: reason,
			Details: map[string]string{"kind": "intermediate", "mesh": truncate(req.GetMesh(), 253)}})
		return status.Error(code, reason)
	}
	if mt == nil {
		return nil, deny(codes.FailedPrecondition, "the mesh has no shared trust: it is unknown or in no valid VirtualMesh with spec.mtls.shared")
	}
	if mt.cluster != cluster {
		return nil, deny(codes.PermissionDenied, "the mesh is not in the caller's cluster")
	}
	csr, err := ca.ParseIntermediateCSR(req.GetCsr())
	if err != nil {
		return nil, deny(codes.InvalidArgument, err.Error())
	}
	cert, err := mt.root.issue(ctx, csr, req.GetMesh())
	if err != nil {
		return nil, deny(codes.Internal, "intermediate not issued: "+err.Error())
	}
	if err := c.cfg.Audit.Record(audit.Event{Type: audit.CertIssue, Result: audit.ResultSuccess, Cluster: cluster,
		Serial: cert.SerialNumber.Text(16), Details: map[string]string{"kind": "intermediate", "mesh": req.GetMesh(), "virtualMesh": mt.vm,
			"notAfter": cert.NotAfter.UTC().Format(time.RFC3339)}}); err != nil {
		return nil, status.Error(codes.Unavailable, "the issuance could not be audited; not issued")
	}
	c.recordIssued(ctx, mt, req.GetMesh(), cert)
	chain := append([]*x509.Certificate{cert}, mt.root.chain()...)
	return &relaypb.IntermediateResponse{CertificateChain: ca.CertsPEM(chain...), RootBundle: mt.req.GetRootBundle(), Issuer: mt.req.GetIssuer()}, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
