package server_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
)

// When a registration ends, the end of its sessions is not written to its
// KubernetesCluster (being deleted; here kept, as a lagging watch would
// still show it): a deregistered fleet costs no status writes. The same
// name registered again, another UID, is written as ever.
func TestEndedRegistrationIsNotWritten(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns = "relaymesh"
	mgmt, _, admin := localcluster.Management(t, ns)
	kcs := admin.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(ns)
	gone, back := registerCluster(t, admin, "gone"), registerCluster(t, admin, "back")

	cfg := mgmt.RESTConfig()
	var mu sync.Mutex
	patched := map[string]int{}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodPatch && strings.HasSuffix(r.URL.Path, "/status") {
				parts := strings.Split(r.URL.Path, "/")
				mu.Lock()
				patched[parts[len(parts)-2]]++
				mu.Unlock()
			}
			return rt.RoundTrip(r)
		})
	}
	client, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)
	status := server.NewKubeStatus(client, ns, slog.New(slog.NewTextHandler(io.Discard, nil)),
		server.StatusConfig{Heartbeat: time.Hour, Resync: time.Hour, Coalesce: 10 * time.Millisecond})
	go status.Run(ctx)
	connected := func(name string) func() (bool, string) {
		return func() (bool, string) {
			o, err := kcs.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			c, _, _ := unstructured.NestedBool(o.Object, "status", "connected")
			return c, "not connected"
		}
	}
	patchesOf := func(name string) int {
		mu.Lock()
		defer mu.Unlock()
		return patched[name]
	}
	for _, c := range []string{"gone", "back"} {
		status.SessionChanged(c, true)
		waitFor(t, 10*time.Second, c+" connected", connected(c))
	}

	// Deregistered: its session ends, and nothing is written.
	before := patchesOf("gone")
	status.Ended(gone)
	status.Forget("gone")
	status.SessionChanged("gone", false)
	time.Sleep(time.Second)
	assert.Equal(t, before, patchesOf("gone"), "no status write to an ended registration")
	ok, _ := connected("gone")()
	assert.True(t, ok, "the ended registration's status is left as it was")

	// Registered again under the same name: the new registration's
	// session is written, although the old one ended.
	require.NoError(t, kcs.Delete(ctx, "back", metav1.DeleteOptions{}))
	status.Ended(back)
	status.Forget("back")
	status.SessionChanged("back", false)
	again := registerCluster(t, admin, "back")
	require.NotEqual(t, back.UID, again.UID)
	status.SessionChanged("back", true)
	waitFor(t, 10*time.Second, "the new registration's session is written", connected("back"))
}
