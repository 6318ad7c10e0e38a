package server_test

import (
	"context"
	"crypto/x509"
	"io"
	"log/slog"
	"math/big"
	"net/url"
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

// Issue 31: an agent this replica just bootstrapped opens its first
// session and pushes its first snapshot at once; the session's status
// waits for that snapshot's summary (up to FirstSnapshotWait), so session,
// summary and first ack are one write, not two. A fresh agent that pushes
// nothing is shown connected when the wait ends; a reconnecting agent and
// an agent that only renewed here are not held at all.
func TestAFreshAgentsSessionWaitsForItsFirstSnapshot(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgmt, _, admin := localcluster.Management(t, "relaymesh")
	client, patches := recordStatusPatches(t, mgmt)
	for _, name := range []string{"fresh", "silent", "renewed"} {
		registerCluster(t, admin, name)
	}
	const wait = 4 * time.Second
	k := server.NewKubeStatus(client, "relaymesh", slog.New(slog.NewTextHandler(io.Discard, nil)),
		server.StatusConfig{Coalesce: 10 * time.Millisecond, FirstSnapshotWait: wait, FirstSessionWait: -1, Heartbeat: time.Hour, Resync: time.Hour})
	go k.Run(ctx)
	status := func(name string) multiclusterv1alpha1.KubernetesClusterStatus {
		u, err := admin.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace("relaymesh").Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		var kc multiclusterv1alpha1.KubernetesCluster
		require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &kc))
		return kc.Status
	}
	cert := func(name string) *x509.Certificate {
		return &x509.Certificate{SerialNumber: big.NewInt(7), NotAfter: time.Now().Add(time.Hour),
			URIs: []*url.URL{{Scheme: "spiffe", Host: "relaymesh.local", Path: "/cluster/" + name}}}
	}
	certified := func(name string, bootstrap bool) {
		t.Helper()
		if bootstrap {
			k.CertificateBootstrapped(name, cert(name), "v1")
		} else {
			k.CertificateIssued(name, cert(name), "v1")
		}
		require.Eventually(t, func() bool { return status(name).AgentCertificate != nil }, 10*time.Second, 10*time.Millisecond, "the certificate is written")
		patches.take()
	}

	certified("fresh", true)
	k.SessionChanged("fresh", true)
	time.Sleep(time.Second) // the ack and the snapshot come a second after the session
	k.Acked("fresh", &relaypb.PullAck{Version: 1_700_000_000_000_000_001, Results: []*relaypb.ObjectResult{{Kind: "Secret", Namespace: "istio-system", Name: "cacerts", Outcome: "applied"}}})
	time.Sleep(100 * time.Millisecond)
	assert.Empty(t, patches.take(), "the session and the ack wait for the first snapshot")
	assert.False(t, status("fresh").Connected)
	k.Discovered("fresh", &multiclusterv1alpha1.DiscoverySummary{Meshes: 1, Workloads: 3, WorkloadsIn: multiclusterv1alpha1.WorkloadsInAPIServer})
	require.Eventually(t, func() bool {
		s := status("fresh")
		return s.Connected && s.Discovered != nil && s.AppliedOutputs != nil
	}, 10*time.Second, 10*time.Millisecond, "session, summary and ack written")
	assert.Len(t, patches.take(), 1, "in one write")

	// A fresh agent that pushes nothing: connected once the wait ends.
	certified("silent", true)
	opened := time.Now()
	k.SessionChanged("silent", true)
	require.Eventually(t, func() bool { return status("silent").Connected }, 10*time.Second, 10*time.Millisecond)
	took := time.Since(opened)
	assert.GreaterOrEqual(t, took, wait-100*time.Millisecond, "held for the snapshot")
	assert.Less(t, took, wait+3*time.Second, "and no longer")
	patches.take()

	// An agent that renewed here (its snapshots went to another replica)
	// and now fails over to this one: not held.
	certified("renewed", false)
	moved := time.Now()
	k.SessionChanged("renewed", true)
	require.Eventually(t, func() bool { return status("renewed").Connected }, 10*time.Second, 10*time.Millisecond)
	assert.Less(t, time.Since(moved), wait/2, "a session after a renewal is written at once")

	// The fresh agent reconnects: this replica has its snapshot, nothing
	// waits.
	k.SessionChanged("fresh", false)
	require.Eventually(t, func() bool { return !status("fresh").Connected }, 10*time.Second, 10*time.Millisecond)
	reopened := time.Now()
	k.SessionChanged("fresh", true)
	require.Eventually(t, func() bool { return status("fresh").Connected }, 10*time.Second, 10*time.Millisecond)
	assert.Less(t, time.Since(reopened), wait/2, "a reconnect is written at once")
}
