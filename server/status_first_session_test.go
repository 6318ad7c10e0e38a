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
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 31: the certificate a Bootstrap issued waits, unwritten, for the
// agent's first session (up to FirstSessionWait), and the session's write
// carries both: in a storm of 10,000 the certificate alone was a write for
// 9 of 10 clusters. An agent that never opens a session has its
// certificate written when the wait ends, counted from its first
// Bootstrap however often it bootstraps again; a renewal is written at
// once, even before the first session; a session's end never waits; and a
// replica that did not issue the certificate (or restarted while it was
// held) names the one the session presented.
func TestAFreshAgentsCertificateWaitsForItsFirstSession(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgmt, _, admin := localcluster.Management(t, "relaymesh")
	client, patches := recordStatusPatches(t, mgmt)
	for _, name := range []string{"fresh", "lost", "renewed", "again", "elsewhere"} {
		registerCluster(t, admin, name)
	}
	const wait = 4 * time.Second
	k := server.NewKubeStatus(client, "relaymesh", slog.New(slog.NewTextHandler(io.Discard, nil)),
		server.StatusConfig{Coalesce: 200 * time.Millisecond, FirstSnapshotWait: -1, FirstSessionWait: wait, Heartbeat: time.Hour, Resync: time.Hour})
	kctx, stopK := context.WithCancel(ctx)
	go k.Run(kctx)
	status := func(name string) multiclusterv1alpha1.KubernetesClusterStatus {
		st, _ := clusterStatus(t, admin, name)
		return st
	}
	serial := int64(0)
	certOf := func(name string) *x509.Certificate {
		serial++
		return &x509.Certificate{SerialNumber: big.NewInt(serial), NotAfter: time.Now().Add(time.Hour + time.Duration(serial)*time.Second),
			URIs: []*url.URL{{Scheme: "spiffe", Host: "relaymesh.local", Path: "/cluster/" + name}}}
	}
	issue := func(name string, bootstrap bool) string {
		c := certOf(name)
		if bootstrap {
			k.CertificateBootstrapped(name, c, "v1")
		} else {
			k.CertificateIssued(name, c, "v1")
		}
		return c.SerialNumber.Text(16)
	}
	hasCert := func(name, serial string) func() bool {
		return func() bool { c := status(name).AgentCertificate; return c != nil && c.Serial == serial }
	}

	// The session comes a second after the Bootstrap: one write of both.
	first := issue("fresh", true)
	time.Sleep(time.Second)
	assert.Empty(t, patches.take(), "the certificate waits for the session")
	assert.Nil(t, status("fresh").AgentCertificate)
	k.SessionChanged("fresh", true)
	require.Eventually(t, func() bool { return status("fresh").Connected && hasCert("fresh", first)() }, 10*time.Second, 10*time.Millisecond,
		"session and certificate written")
	assert.Len(t, patches.take(), 1, "in one write")

	// No session ever: the certificate is written when the wait ends.
	issued := time.Now()
	lost := issue("lost", true)
	require.Eventually(t, hasCert("lost", lost), 10*time.Second, 10*time.Millisecond)
	took := time.Since(issued)
	assert.GreaterOrEqual(t, took, wait-100*time.Millisecond, "held for the session")
	assert.Less(t, took, wait+3*time.Second, "and no longer")
	assert.False(t, status("lost").Connected)
	patches.take()

	// A renewal waits for nothing, even before the first session.
	issue("renewed", true)
	time.Sleep(time.Second)
	assert.Nil(t, status("renewed").AgentCertificate, "the Bootstrap's certificate waits")
	renewedAt := time.Now()
	renewal := issue("renewed", false)
	require.Eventually(t, hasCert("renewed", renewal), 10*time.Second, 10*time.Millisecond)
	assert.Less(t, time.Since(renewedAt), wait/2, "a renewal is written at once")

	// Bootstrapping again does not move the end of the wait on.
	first = issue("again", true)
	firstAt := time.Now()
	time.Sleep(wait / 2)
	last := issue("again", true)
	require.Eventually(t, hasCert("again", last), 10*time.Second, 10*time.Millisecond)
	assert.Less(t, time.Since(firstAt), wait+time.Second, "the wait counts from the first Bootstrap")

	// The session's end is written at once, whatever is held.
	issue("fresh", true)
	ended := time.Now()
	k.SessionChanged("fresh", false)
	require.Eventually(t, func() bool { return !status("fresh").Connected }, 10*time.Second, 10*time.Millisecond)
	assert.Less(t, time.Since(ended), wait/2, "a session's end never waits")

	// The replica stops while it holds a Bootstrap's certificate; restarted
	// (a new status writer that never issued it), it names the certificate
	// the agent's session presented in the session's write.
	held := issue("elsewhere", true)
	time.Sleep(500 * time.Millisecond)
	stopK()
	restarted := server.NewKubeStatus(client, "relaymesh", slog.New(slog.NewTextHandler(io.Discard, nil)),
		server.StatusConfig{Coalesce: 200 * time.Millisecond, FirstSnapshotWait: -1, FirstSessionWait: wait, Heartbeat: time.Hour, Resync: time.Hour})
	go restarted.Run(ctx)
	presented := certOf("elsewhere")
	presented.SerialNumber = big.NewInt(serial - 1) // the certificate issued before the restart
	opened := time.Now()
	restarted.CertificatePresented("elsewhere", presented)
	restarted.SessionChanged("elsewhere", true)
	require.Eventually(t, func() bool { return status("elsewhere").Connected && hasCert("elsewhere", held)() }, 10*time.Second, 10*time.Millisecond)
	assert.Less(t, time.Since(opened), wait/2, "the session and the certificate it presented, written at once")
}
