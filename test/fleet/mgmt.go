package fleet

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/server"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
)

// Management is the harness's own access to the management cluster: it
// registers clusters and reads back what the server wrote. Its client is
// given a budget far above the server's, so the harness is never what a
// measurement waits for.
type Management struct {
	// Namespace is the server's namespace.
	Namespace string
	Kube      kubernetes.Interface
	Dynamic   dynamic.Interface
	// Metadata reads objects' metadata alone.
	Metadata metadata.Interface
	config   *rest.Config
}

// NewManagement returns clients for cfg (an admin config) and creates
// namespace if it does not exist.
func NewManagement(ctx context.Context, cfg *rest.Config, namespace string) (*Management, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 5000, 10000
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	_, err = kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create namespace %s: %w", namespace, err)
	}
	return &Management{Namespace: namespace, Kube: kube, Dynamic: dyn, Metadata: meta, config: cfg}, nil
}

// Member is a registered cluster and its bootstrap token. The token is a
// secret: it is never logged or printed.
type Member struct {
	Cluster string
	Token   string
}

// ClusterNames returns prefix-0 … prefix-(n-1).
func ClusterNames(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

// Register registers each cluster the way `relaymesh cluster register` does
// in the management cluster (a relay-mode KubernetesCluster, then a
// single-use token minted with identity.Tokens over the Kubernetes token
// store, as `relaymesh token create` mints one), parallel at a time. It
// needs the relay CA, so start the server first.
func (m *Management) Register(ctx context.Context, names []string, tokenTTL time.Duration, parallel int) ([]Member, error) {
	if _, err := ca.RelayRootsPEM(ctx, m.Kube, m.Namespace); err != nil {
		return nil, fmt.Errorf("relay CA not found (start the server first): %w", err)
	}
	store, err := identity.NewKubeTokenStore(m.Kube, m.Namespace)
	if err != nil {
		return nil, err
	}
	tokens, err := identity.NewTokens(identity.TokensConfig{Store: store})
	if err != nil {
		return nil, err
	}
	clusters := m.Dynamic.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(m.Namespace)
	members := make([]Member, len(names))
	err = parallelDo(ctx, len(names), parallel, func(ctx context.Context, i int) error {
		name := names[i]
		if err := identity.ValidateClusterName(name); err != nil {
			return err
		}
		kc := &multiclusterv1alpha1.KubernetesCluster{
			TypeMeta:   metav1.TypeMeta{APIVersion: multiclusterv1alpha1.GroupVersion.String(), Kind: "KubernetesCluster"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: m.Namespace},
			Spec:       multiclusterv1alpha1.KubernetesClusterSpec{Mode: multiclusterv1alpha1.ModeRelay, ClusterDomain: "cluster.local"},
		}
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(kc)
		if err != nil {
			return err
		}
		if _, err := clusters.Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create KubernetesCluster %s: %w", name, err)
		}
		token, _, err := tokens.Mint(ctx, name, tokenTTL)
		if err != nil {
			return fmt.Errorf("mint a token for %s: %w", name, err)
		}
		members[i] = Member{Cluster: name, Token: token}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return members, nil
}

// MintToken mints one more token for a registered cluster, as `relaymesh
// token create` does.
func (m *Management) MintToken(ctx context.Context, cluster string, ttl time.Duration) (string, error) {
	store, err := identity.NewKubeTokenStore(m.Kube, m.Namespace)
	if err != nil {
		return "", err
	}
	tokens, err := identity.NewTokens(identity.TokensConfig{Store: store})
	if err != nil {
		return "", err
	}
	token, _, err := tokens.Mint(ctx, cluster, ttl)
	return token, err
}

// Deregister deregisters each cluster as `relaymesh cluster deregister`
// does in the management cluster: delete the KubernetesCluster, then its
// unused tokens.
func (m *Management) Deregister(ctx context.Context, names []string, parallel int) error {
	store, err := identity.NewKubeTokenStore(m.Kube, m.Namespace)
	if err != nil {
		return err
	}
	clusters := m.Dynamic.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(m.Namespace)
	return parallelDo(ctx, len(names), parallel, func(ctx context.Context, i int) error {
		if err := clusters.Delete(ctx, names[i], metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete KubernetesCluster %s: %w", names[i], err)
		}
		if err := store.DeleteCluster(ctx, names[i]); err != nil {
			return fmt.Errorf("delete the tokens of %s: %w", names[i], err)
		}
		return nil
	})
}

// RelayRoots returns the relay roots the server published, for agents to pin.
func (m *Management) RelayRoots(ctx context.Context) (*x509.CertPool, error) {
	pemBytes, err := ca.RelayRootsPEM(ctx, m.Kube, m.Namespace)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemBytes) {
		return nil, errors.New("relay roots: no certificate")
	}
	return pool, nil
}

// UnauditedTokens counts the bootstrap-token records whose minting the
// server has not yet recorded in its audit log (it marks each one it did).
func (m *Management) UnauditedTokens(ctx context.Context) (int, error) {
	list, err := m.Kube.CoreV1().Secrets(m.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "relaymesh.io/bootstrap-token=true"})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, s := range list.Items {
		if s.Annotations["relaymesh.io/audited"] != "true" {
			n++
		}
	}
	return n, nil
}

// ClusterStatus is what one KubernetesCluster's status says about its agent.
type ClusterStatus struct {
	Cluster   string
	HasStatus bool
	Connected bool
	Serial    string
	LastSeen  time.Time
}

// ClusterStatuses reads the status of every KubernetesCluster of the
// namespace, by name.
func (m *Management) ClusterStatuses(ctx context.Context) (map[string]ClusterStatus, error) {
	list, err := m.Dynamic.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(m.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := make(map[string]ClusterStatus, len(list.Items))
	for _, u := range list.Items {
		kc := &multiclusterv1alpha1.KubernetesCluster{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, kc); err != nil {
			return nil, fmt.Errorf("KubernetesCluster %s: %w", u.GetName(), err)
		}
		st := ClusterStatus{Cluster: kc.Name, Connected: kc.Status.Connected}
		_, st.HasStatus = u.Object["status"]
		if kc.Status.AgentCertificate != nil {
			st.Serial = kc.Status.AgentCertificate.Serial
		}
		if kc.Status.LastSeen != nil {
			st.LastSeen = kc.Status.LastSeen.Time
		}
		out[kc.Name] = st
	}
	return out, nil
}

// DiscoveredKinds are the kinds the server mirrors from snapshots.
var DiscoveredKinds = []schema.GroupVersionResource{discoveryv1alpha1.Meshes, discoveryv1alpha1.Workloads, discoveryv1alpha1.Destinations}

// DiscoveredSums are the Mesh, Workload and Destination objects of cluster
// in the namespace, by resource/name, each with the sum of its spec the
// server wrote in it; read as metadata only (a large cluster's objects are
// tens of megabytes in full).
func (m *Management) DiscoveredSums(ctx context.Context, cluster string) (map[string]string, error) {
	out := map[string]string{}
	for _, gvr := range DiscoveredKinds {
		list, err := m.Metadata.Resource(gvr).Namespace(m.Namespace).List(ctx, metav1.ListOptions{LabelSelector: server.LabelCluster + "=" + cluster})
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", gvr.Resource, err)
		}
		for _, o := range list.Items {
			out[gvr.Resource+"/"+o.GetName()] = o.GetAnnotations()[server.AnnotationSpecSum]
		}
	}
	return out, nil
}

// SpecSums are objs by resource/name, each with its spec's sum: what
// DiscoveredSums reads once the server has written them.
func SpecSums(objs []server.DiscoveredObject) map[string]string {
	out := make(map[string]string, len(objs))
	for _, o := range objs {
		out[o.Resource.Resource+"/"+o.Object.GetName()] = o.Object.GetAnnotations()[server.AnnotationSpecSum]
	}
	return out
}

// DiscoveredObjects counts the Mesh, Workload and Destination objects of the
// namespace whose cluster label is one of clusters (nil: any).
func (m *Management) DiscoveredObjects(ctx context.Context, clusters map[string]bool) (int, error) {
	n := 0
	for _, gvr := range DiscoveredKinds {
		list, err := m.Dynamic.Resource(gvr).Namespace(m.Namespace).List(ctx, metav1.ListOptions{LabelSelector: server.LabelCluster})
		if err != nil {
			return 0, fmt.Errorf("list %s: %w", gvr.Resource, err)
		}
		for _, o := range list.Items {
			if clusters == nil || clusters[o.GetLabels()[server.LabelCluster]] {
				n++
			}
		}
	}
	return n, nil
}

// APIRequests reads the management API server's request counters
// (apiserver_request_total), keyed "VERB resource[/subresource]".
func (m *Management) APIRequests(ctx context.Context) (map[string]float64, error) {
	raw, err := m.Kube.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("API server metrics: %w", err)
	}
	out := map[string]float64{}
	for series, v := range ParseMetrics(string(raw)) {
		base, labels, _ := strings.Cut(series, "{")
		if base != "apiserver_request_total" {
			continue
		}
		l := parseLabels(strings.TrimSuffix(labels, "}"))
		key := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			key += "/" + l["subresource"]
		}
		out[key] += v
	}
	return out, nil
}

// parseLabels reads `a="x",b="y"` (label values the API server exposes
// hold no quotes or commas).
func parseLabels(s string) map[string]string {
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if ok {
			out[k] = strings.Trim(v, `"`)
		}
	}
	return out
}

// parallelDo runs f(i) for i in [0, n) with at most parallel at once and
// returns the first error (the others still finish).
func parallelDo(ctx context.Context, n, parallel int, f func(ctx context.Context, i int) error) error {
	if parallel < 1 {
		parallel = 1
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	next := make(chan int)
	for range min(parallel, max(n, 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(ctx, i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return first
}

// TrafficPolicies is the resource of TrafficPolicy objects.
var TrafficPolicies = networkingv1alpha1.TrafficPolicies

// SetRequestTimeout creates the TrafficPolicy name in the server's namespace
// with no selectors (every Destination, every source) and the given
// request timeout, or changes the timeout of the one that exists.
func (m *Management) SetRequestTimeout(ctx context.Context, name, timeout string) error {
	tps := m.Dynamic.Resource(TrafficPolicies).Namespace(m.Namespace)
	patch := []byte(`{"spec":{"policy":{"requestTimeout":"` + timeout + `"}}}`)
	if _, err := time.ParseDuration(timeout); err != nil {
		return fmt.Errorf("timeout: %w", err)
	}
	_, err := tps.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	if !apierrors.IsNotFound(err) {
		return err
	}
	tp := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": TrafficPolicies.GroupVersion().String(), "kind": "TrafficPolicy",
		"metadata": map[string]any{"name": name, "namespace": m.Namespace},
		"spec":     map[string]any{"policy": map[string]any{"requestTimeout": timeout}},
	}}
	_, err = tps.Create(ctx, tp, metav1.CreateOptions{})
	return err
}

// DeleteTrafficPolicy deletes a TrafficPolicy of the server's namespace.
func (m *Management) DeleteTrafficPolicy(ctx context.Context, name string) error {
	err := m.Dynamic.Resource(TrafficPolicies).Namespace(m.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
