package server_test

import (
	"context"
	"crypto/x509"
	"io"
	"log/slog"
	"math/big"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Two replicas write one cluster's status: the one holding the session
// says so; the one whose session ended late does not overwrite it; an ack
// written by one is read by the other (the leader reads every cluster's);
// an older ack never replaces a newer one; a hostile ack is cut to what the
// status keeps; and the leader's sweep marks disconnected the clusters of a
// replica that is gone.
func TestClusterStatusAcrossReplicas(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, _, client := localcluster.Management(t, "relaymesh")
	registerCluster(t, client, "c1")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a := server.NewKubeStatus(client, "relaymesh", log, server.StatusConfig{Replica: "a", Coalesce: 10 * time.Millisecond})
	b := server.NewKubeStatus(client, "relaymesh", log, server.StatusConfig{Replica: "b", Coalesce: 10 * time.Millisecond})
	var acksOnA atomic.Int32
	a.OnAck(func(c string) {
		if c == "c1" {
			acksOnA.Add(1)
		}
	})
	go a.Run(ctx)
	go b.Run(ctx)
	status := func() multiclusterv1alpha1.KubernetesClusterStatus {
		u, err := client.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace("relaymesh").Get(ctx, "c1", metav1.GetOptions{})
		require.NoError(t, err)
		var kc multiclusterv1alpha1.KubernetesCluster
		require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &kc))
		return kc.Status
	}
	eventually := func(msg string, f func(multiclusterv1alpha1.KubernetesClusterStatus) bool) {
		t.Helper()
		require.Eventually(t, func() bool { return f(status()) }, 10*time.Second, 20*time.Millisecond, msg)
	}

	a.SessionChanged("c1", true)
	eventually("a holds the session", func(s multiclusterv1alpha1.KubernetesClusterStatus) bool { return s.Connected && s.Replica == "a" })
	b.SessionChanged("c1", true) // the agent failed over to b
	eventually("b holds the session", func(s multiclusterv1alpha1.KubernetesClusterStatus) bool { return s.Connected && s.Replica == "b" })
	a.SessionChanged("c1", false) // a notices its old session ended, late
	time.Sleep(500 * time.Millisecond)
	st := status()
	assert.True(t, st.Connected, "a replica that lost the agent to another does not mark it disconnected")
	assert.Equal(t, "b", st.Replica)

	b.Acked("c1", &relaypb.PullAck{Version: 1_700_000_000_000_000_002, Results: []*relaypb.ObjectResult{
		{Kind: "Secret", Namespace: "istio-system", Name: "cacerts", Outcome: "applied"},
		{ApiVersion: "networking.istio.io/v1", Kind: "VirtualService", Namespace: "x", Name: "a", Outcome: "conflict", Error: "not ours"}}})
	require.Eventually(t, func() bool { return a.Ack("c1").GetVersion() == 1_700_000_000_000_000_002 }, 10*time.Second, 20*time.Millisecond, "the other replica reads the ack")
	got := a.Ack("c1").GetResults()
	require.Len(t, got, 2)
	assert.Equal(t, "conflict", got[0].GetOutcome(), "failures first")
	assert.Equal(t, "cacerts", got[1].GetName())
	assert.Eventually(t, func() bool { return acksOnA.Load() > 0 }, 5*time.Second, 10*time.Millisecond, "the other replica heard of the ack")

	a.Acked("c1", &relaypb.PullAck{Version: 1_700_000_000_000_000_001}) // an older ack, from a stale session
	time.Sleep(500 * time.Millisecond)
	assert.Equal(t, "1700000000000000002", status().AppliedOutputs.Version, "never an older ack over a newer one")

	// A hostile agent's ack: thousands of results, long strings.
	var hostile []*relaypb.ObjectResult
	for range 5000 {
		hostile = append(hostile, &relaypb.ObjectResult{Kind: strings.Repeat("K", 10000), Name: strings.Repeat("n", 10000), Outcome: "error", Error: strings.Repeat("e", 100000)})
	}
	view := server.NewView()
	view.Acked("c1", &relaypb.PullAck{Version: 1_700_000_000_000_000_003, Results: hostile}, time.Now())
	b.Acked("c1", view.Ack("c1"))
	eventually("the hostile ack is kept, bounded", func(s multiclusterv1alpha1.KubernetesClusterStatus) bool {
		return s.AppliedOutputs != nil && s.AppliedOutputs.Version == "1700000000000000003"
	})
	st = status()
	assert.Len(t, st.AppliedOutputs.Results, 256)
	for _, r := range st.AppliedOutputs.Results {
		assert.LessOrEqual(t, len(r.Kind), 253)
		assert.LessOrEqual(t, len(r.Error), 256)
	}

	// The agent (its session on b) renews at whichever replica it reaches:
	// a certificate a issued is written although b holds the session, and
	// neither replica writes an older certificate over a newer one.
	cert := func(serial int64, notAfter time.Time) *x509.Certificate {
		return &x509.Certificate{SerialNumber: big.NewInt(serial), NotAfter: notAfter,
			URIs: []*url.URL{{Scheme: "spiffe", Host: "relaymesh.local", Path: "/cluster/c1"}}}
	}
	t0 := time.Now().Truncate(time.Second)
	b.CertificateIssued("c1", cert(1, t0.Add(time.Hour)), "")
	eventually("b's certificate", func(s multiclusterv1alpha1.KubernetesClusterStatus) bool {
		return s.AgentCertificate != nil && s.AgentCertificate.Serial == "1"
	})
	a.CertificateIssued("c1", cert(2, t0.Add(2*time.Hour)), "")
	eventually("a renewal served by the replica without the session is written", func(s multiclusterv1alpha1.KubernetesClusterStatus) bool {
		return s.AgentCertificate != nil && s.AgentCertificate.Serial == "2"
	})
	b.SessionChanged("c1", true) // b writes its facts again
	a.CertificateIssued("c1", cert(3, t0.Add(90*time.Minute)), "")
	time.Sleep(500 * time.Millisecond)
	st = status()
	assert.Equal(t, "2", st.AgentCertificate.Serial, "never an older certificate over a newer one, from either replica")
	assert.Equal(t, "b", st.Replica, "and the session stays b's")
	assert.True(t, st.Connected)

	// Two renewals within one second end in the same second: the later
	// one is written although its serial is the lower (serials are
	// random), because the replica that issued both knows their order;
	// another replica's certificate of that second is ordered by serial.
	a.CertificateIssued("c1", cert(0x90, t0.Add(3*time.Hour)), "")
	eventually("a's renewal", func(s multiclusterv1alpha1.KubernetesClusterStatus) bool {
		return s.AgentCertificate != nil && s.AgentCertificate.Serial == "90"
	})
	a.CertificateIssued("c1", cert(0x50, t0.Add(3*time.Hour)), "")
	eventually("a's next renewal in the same second, lower serial", func(s multiclusterv1alpha1.KubernetesClusterStatus) bool {
		return s.AgentCertificate != nil && s.AgentCertificate.Serial == "50"
	})
	b.CertificateIssued("c1", cert(0x40, t0.Add(3*time.Hour)), "")
	time.Sleep(500 * time.Millisecond)
	assert.Equal(t, "50", status().AgentCertificate.Serial, "another replica's certificate of that second, lower serial: not written over it")

	// b is gone (its Lease expired): the leader's sweep marks c1
	// disconnected; a cluster of a live replica stays.
	sweepCtx, stopSweep := context.WithCancel(ctx)
	defer stopSweep()
	go a.Sweep(sweepCtx, 50*time.Millisecond, func(context.Context) (map[string]bool, error) { return map[string]bool{"a": true, "b": true}, nil })
	time.Sleep(300 * time.Millisecond)
	assert.True(t, status().Connected, "a live replica's cluster stays connected")
	stopSweep()
	go a.Sweep(ctx, 50*time.Millisecond, func(context.Context) (map[string]bool, error) { return map[string]bool{"a": true}, nil })
	eventually("the sweep marks a gone replica's cluster disconnected", func(s multiclusterv1alpha1.KubernetesClusterStatus) bool { return !s.Connected })
}
