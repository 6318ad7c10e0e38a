package server_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
)

// A storm of agent events (sessions opening and closing, certificates
// issued) over 300 clusters ends with every KubernetesCluster status right,
// in far fewer writes than events; an apiserver frozen for 10 seconds in the
// middle loses nothing either: the writes are retried, not dropped.
func TestClusterStatusIsNeverLost(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgmt, _, admin := localcluster.Management(t, "relaymesh")
	const clusters = 300
	for i := range clusters {
		registerCluster(t, admin, fmt.Sprintf("c%d", i))
	}
	// The server's client, counting its status writes.
	cfg := mgmt.RESTConfig()
	cfg.QPS, cfg.Burst = 50, 100
	var patches atomic.Int64
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodPatch && strings.HasSuffix(r.URL.Path, "/status") {
				patches.Add(1)
			}
			return rt.RoundTrip(r)
		})
	}
	client, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)
	status := server.NewKubeStatus(client, "relaymesh", slog.New(slog.NewTextHandler(io.Discard, nil)), server.StatusConfig{Heartbeat: time.Hour, Resync: 2 * time.Second})
	go status.Run(ctx)

	cert := func(i, gen int) *x509.Certificate {
		u, _ := url.Parse(fmt.Sprintf("spiffe://relaymesh.test/cluster/c%d/agent", i))
		return &x509.Certificate{SerialNumber: big.NewInt(int64(i*1000 + gen)), URIs: []*url.URL{u}, NotAfter: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	}
	storm := func(gen int) {
		var wg sync.WaitGroup
		for i := range clusters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for g := 1; g <= gen; g++ {
					status.CertificateIssued(fmt.Sprintf("c%d", i), cert(i, g), "v1.2.3")
					status.SessionChanged(fmt.Sprintf("c%d", i), g%2 == 0) // flaps, ends connected iff gen is even
				}
			}()
		}
		wg.Wait()
	}
	check := func(gen int) func() (bool, string) {
		return func() (bool, string) {
			l, err := admin.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace("relaymesh").List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err.Error()
			}
			wrong := 0
			var first string
			for _, o := range l.Items {
				kc := &multiclusterv1alpha1.KubernetesCluster{}
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, kc); err != nil {
					return false, err.Error()
				}
				var i int
				_, _ = fmt.Sscanf(kc.Name, "c%d", &i)
				want := fmt.Sprintf("%x", cert(i, gen).SerialNumber)
				if kc.Status.Connected != (gen%2 == 0) || kc.Status.AgentCertificate == nil || kc.Status.AgentCertificate.Serial != want || kc.Status.AgentVersion != "v1.2.3" || kc.Status.LastSeen == nil {
					wrong++
					if first == "" {
						first = fmt.Sprintf("%s: %+v", kc.Name, kc.Status)
					}
				}
			}
			return wrong == 0, fmt.Sprintf("%d of %d wrong, e.g. %s", wrong, len(l.Items), first)
		}
	}

	start := time.Now()
	storm(10) // 6,000 events
	waitFor(t, 20*time.Second, "every status after the storm", check(10))
	t.Logf("6,000 events over %d clusters: every status right %s after the storm began, in %d writes", clusters, time.Since(start).Round(time.Millisecond), patches.Load())
	assert.Less(t, patches.Load(), int64(6000/2), "events coalesce")

	// The apiserver freezes for 10 s while another storm comes in.
	require.NoError(t, syscall.Kill(mgmt.Pid(), syscall.SIGSTOP))
	storm(11)
	time.Sleep(10 * time.Second)
	require.NoError(t, syscall.Kill(mgmt.Pid(), syscall.SIGCONT))
	resumed := time.Now()
	waitFor(t, 60*time.Second, "every status after the apiserver came back", check(11))
	t.Logf("after a 10 s apiserver freeze: every status right %s after it resumed", time.Since(resumed).Round(time.Millisecond))

	// Drift is repaired: someone else rewrites a status, the resync puts it
	// back.
	_, err = admin.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace("relaymesh").Patch(ctx, "c7", "application/merge-patch+json",
		[]byte(`{"status":{"connected":true,"agentVersion":"forged"}}`), metav1.PatchOptions{}, "status")
	require.NoError(t, err)
	waitFor(t, 20*time.Second, "the resync repairs a changed status", check(11))
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		ok, msg := cond()
		if ok {
			return
		}
		last = msg
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s (last: %s)", timeout, what, last)
}
