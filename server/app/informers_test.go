package app_test

import (
	"maps"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/server/app/apptest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// watchCounter counts the watches a client opened, by resource and scope.
type watchCounter struct {
	mu      sync.Mutex
	watches map[string]int
}

func (w *watchCounter) RoundTrip(next http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := next.RoundTrip(r)
		// A watch the apiserver refused (429 while a new resource's watch
		// cache initializes; the reflector retries) is not open.
		if r.URL.Query().Get("watch") == "true" && err == nil && resp.StatusCode == http.StatusOK {
			w.mu.Lock()
			w.watches[watchKey(r.URL.Path)]++
			w.mu.Unlock()
		}
		return resp, err
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// watchKey is "<resource>" for a cluster-wide watch and
// "<namespace>/<resource>" for a namespaced one.
func watchKey(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i, p := range parts {
		if p == "namespaces" && i+2 < len(parts) {
			return parts[i+1] + "/" + parts[i+2]
		}
	}
	return parts[len(parts)-1]
}

func (w *watchCounter) count() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.watches)
}

// The server's components share one informer per resource (issue 31): the
// registration watch, the cluster status writer, translation and shared
// trust read the same KubernetesClusters, the mirror, translation and
// trust the same Meshes, and each is watched once — and cached once,
// without managedFields. Before, each component had its own: four watches
// of the KubernetesClusters, three of the Meshes.
func TestTheServerWatchesEachResourceOnce(t *testing.T) {
	const ns = "informers"
	admin := apptest.Management(t, ns)
	counter := &watchCounter{watches: map[string]int{}}
	cfg := rest.CopyConfig(admin.Config)
	cfg.Wrap(counter.RoundTrip)
	typed, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	dyn, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)
	kube := &kubeclient.Clients{Config: cfg, Typed: typed, Dynamic: dyn}

	a := apptest.StartApp(t, kube, apptest.AppConfig(t, ns, ""))
	// Each resource watched (its watch may open just after the server
	// serves on a loaded machine), then a moment for a second, late
	// watcher of any of them to show.
	watched := []string{ns + "/kubernetesclusters", ns + "/meshes", ns + "/workloads", ns + "/destinations", "virtualmeshes", "trafficpolicies", "accesspolicies", "virtualdestinations"}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		w := counter.count()
		for _, r := range watched {
			assert.NotZero(c, w[r], "watches of %s: %v", r, w)
		}
	}, 30*time.Second, 50*time.Millisecond, "every resource watched")
	time.Sleep(2 * time.Second)
	watches := counter.count()
	for _, resource := range []string{"kubernetesclusters", "meshes", "workloads", "destinations"} {
		assert.Equal(t, 1, watches[ns+"/"+resource], "watches of %s in %s: %v", resource, ns, watches)
	}
	for _, resource := range []string{"virtualmeshes", "trafficpolicies", "accesspolicies", "virtualdestinations"} {
		assert.Equal(t, 1, watches[resource], "cluster-wide watches of %s: %v", resource, watches)
	}
	// The SPIFFE import (a once-only task) watches FederatedTrustDomains
	// for its term with informers of its own, beside shared trust's.
	assert.LessOrEqual(t, watches[ns+"/federatedtrustdomains"], 2, "%v", watches)
	t.Logf("watches opened by the server: %v", watches)
	require.NoError(t, a.Stop())
}
