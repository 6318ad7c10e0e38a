package apply_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"

	"github.com/relaymesh/relaymesh/agent/apply"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/internal/syncbuf"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
)

const owner = "relaymesh-agent"

var (
	virtualServices  = outputs.VirtualServices
	destinationRules = outputs.DestinationRules
	serviceEntries   = outputs.ServiceEntries
)

// fixture is one real kube-apiserver with Istio's CRDs and the namespaces
// app-a and app-b.
type fixture struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
	cs     kubernetes.Interface
	logs   *syncbuf.Buffer
	// cluster is the apiserver, for what a test installs (Gateway API).
	cluster *localcluster.Cluster
}

func newFixture(tb testing.TB) *fixture {
	tb.Helper()
	localcluster.SkipIfShort(tb)
	ctx := context.Background()
	env, err := localcluster.Start(ctx, localcluster.Config{Dir: tb.TempDir(), Clusters: []string{"cluster-1"}})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = env.Stop() })
	cfg := env.Cluster("cluster-1").RESTConfig()
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	require.NoError(tb, err)
	dyn, err := dynamic.NewForConfig(cfg)
	require.NoError(tb, err)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(tb, err)
	for _, ns := range []string{"app-a", "app-b"} {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		require.NoError(tb, err)
	}
	return &fixture{
		dyn:     dyn,
		mapper:  restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)),
		cs:      cs,
		logs:    &syncbuf.Buffer{},
		cluster: env.Cluster("cluster-1"),
	}
}

// applier returns an Applier for the fixture; edit changes its config.
func (f *fixture) applier(tb testing.TB, edit func(*apply.Config)) *apply.Applier {
	tb.Helper()
	cfg := apply.Config{
		Dynamic: f.dyn,
		Mapper:  f.mapper,
		Owner:   owner,
		Logger:  slog.New(slog.NewTextHandler(f.logs, nil)),
	}
	if edit != nil {
		edit(&cfg)
	}
	a, err := apply.New(cfg)
	require.NoError(tb, err)
	return a
}

// get returns the object, or nil if it does not exist.
func (f *fixture) get(tb testing.TB, gvr schema.GroupVersionResource, ns, name string) *unstructured.Unstructured {
	tb.Helper()
	o, err := f.dyn.Resource(gvr).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	require.NoError(tb, err)
	return o
}

// create creates an object as a user would (field manager "kubectl").
func (f *fixture) create(tb testing.TB, gvr schema.GroupVersionResource, obj map[string]any) *unstructured.Unstructured {
	tb.Helper()
	u := &unstructured.Unstructured{Object: obj}
	got, err := f.dyn.Resource(gvr).Namespace(u.GetNamespace()).Create(context.Background(), u, metav1.CreateOptions{FieldManager: "kubectl"})
	require.NoError(tb, err)
	return got
}

// apply1 applies a set and fails the test if the whole set is refused.
func apply1(tb testing.TB, a *apply.Applier, objs ...*relaypb.OutputObject) map[string]*relaypb.ObjectResult {
	tb.Helper()
	results, err := a.Apply(context.Background(), &relaypb.OutputSet{Version: 1, Objects: objs})
	require.NoError(tb, err)
	return byName(results)
}

// byName indexes results by "Kind/namespace/name".
func byName(results []*relaypb.ObjectResult) map[string]*relaypb.ObjectResult {
	out := map[string]*relaypb.ObjectResult{}
	for _, r := range results {
		out[r.GetKind()+"/"+r.GetNamespace()+"/"+r.GetName()] = r
	}
	return out
}

// outcomes maps "Kind/namespace/name" to outcome.
func outcomes(results map[string]*relaypb.ObjectResult) map[string]string {
	out := map[string]string{}
	for k, r := range results {
		out[k] = r.GetOutcome()
	}
	return out
}

func virtualService(ns, name, host string) map[string]any {
	return map[string]any{
		"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"hosts":    []any{host},
			"gateways": []any{"mesh"},
			"http": []any{map[string]any{
				"route": []any{map[string]any{"destination": map[string]any{"host": host, "subset": "v1"}}},
			}},
		},
	}
}

func destinationRule(ns, name, host string) map[string]any {
	return map[string]any{
		"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"host":    host,
			"subsets": []any{map[string]any{"name": "v1", "labels": map[string]any{"version": "v1"}}},
		},
	}
}

func serviceEntry(ns, name, host string) map[string]any {
	return map[string]any{
		"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"hosts":      []any{host},
			"location":   "MESH_EXTERNAL",
			"resolution": "DNS",
			"ports":      []any{map[string]any{"number": int64(443), "name": "tls", "protocol": "TLS"}},
		},
	}
}

// withMeta returns a copy of obj with metadata fields set.
func withMeta(obj map[string]any, kv ...any) map[string]any {
	out := deepCopy(obj)
	md := out["metadata"].(map[string]any)
	for i := 0; i < len(kv); i += 2 {
		md[kv[i].(string)] = kv[i+1]
	}
	return out
}

func deepCopy(obj map[string]any) map[string]any {
	return (&unstructured.Unstructured{Object: obj}).DeepCopy().Object
}

// output encodes obj as an OutputObject.
func output(tb testing.TB, obj map[string]any, parents ...string) *relaypb.OutputObject {
	tb.Helper()
	b, err := json.Marshal(obj)
	require.NoError(tb, err)
	return &relaypb.OutputObject{Manifest: b, Parents: parents}
}

func key(kind, ns, name string) string { return fmt.Sprintf("%s/%s/%s", kind, ns, name) }

// hookedDynamic wraps a dynamic client so a test can act, as a user would,
// between the agent's read and its write.
type hookedDynamic struct {
	dynamic.Interface
	mu sync.Mutex
	// afterGet runs after every namespaced Get, with its error.
	afterGet func(gvr schema.GroupVersionResource, ns, name string, err error)
	// afterList runs after every cluster-wide List.
	afterList func(gvr schema.GroupVersionResource)
	// writes counts Create, Patch and Delete calls.
	writes int
}

func (h *hookedDynamic) writeCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.writes
}

func (h *hookedDynamic) wrote() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.writes++
}

func (h *hookedDynamic) setHooks(get func(schema.GroupVersionResource, string, string, error), list func(schema.GroupVersionResource)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.afterGet, h.afterList = get, list
}

func (h *hookedDynamic) Resource(gvr schema.GroupVersionResource) dynamic.NamespaceableResourceInterface {
	return hookedResource{NamespaceableResourceInterface: h.Interface.Resource(gvr), h: h, gvr: gvr}
}

type hookedResource struct {
	dynamic.NamespaceableResourceInterface
	h   *hookedDynamic
	gvr schema.GroupVersionResource
}

func (r hookedResource) Namespace(ns string) dynamic.ResourceInterface {
	return hookedNamespaced{ResourceInterface: r.NamespaceableResourceInterface.Namespace(ns), h: r.h, gvr: r.gvr, ns: ns}
}

func (r hookedResource) List(ctx context.Context, opts metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	list, err := r.NamespaceableResourceInterface.List(ctx, opts)
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	if r.h.afterList != nil {
		r.h.afterList(r.gvr)
	}
	return list, err
}

type hookedNamespaced struct {
	dynamic.ResourceInterface
	h   *hookedDynamic
	gvr schema.GroupVersionResource
	ns  string
}

func (n hookedNamespaced) Get(ctx context.Context, name string, opts metav1.GetOptions, sub ...string) (*unstructured.Unstructured, error) {
	o, err := n.ResourceInterface.Get(ctx, name, opts, sub...)
	n.h.mu.Lock()
	defer n.h.mu.Unlock()
	if n.h.afterGet != nil {
		n.h.afterGet(n.gvr, n.ns, name, err)
	}
	return o, err
}

func (n hookedNamespaced) Create(ctx context.Context, obj *unstructured.Unstructured, opts metav1.CreateOptions, sub ...string) (*unstructured.Unstructured, error) {
	n.h.wrote()
	return n.ResourceInterface.Create(ctx, obj, opts, sub...)
}

func (n hookedNamespaced) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, sub ...string) (*unstructured.Unstructured, error) {
	n.h.wrote()
	return n.ResourceInterface.Patch(ctx, name, pt, data, opts, sub...)
}

func (n hookedNamespaced) Delete(ctx context.Context, name string, opts metav1.DeleteOptions, sub ...string) error {
	n.h.wrote()
	return n.ResourceInterface.Delete(ctx, name, opts, sub...)
}
