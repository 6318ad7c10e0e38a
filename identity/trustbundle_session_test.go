package identity_test

import (
	"context"
	"crypto/x509"
	"sync"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/agent"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/identity/identitytest"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/server/servertest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bundleSource is a server.TrustBundleSource a test sets.
type bundleSource struct {
	mu      sync.Mutex
	current *relaypb.TrustBundle
	acks    map[string]*relaypb.TrustBundleAck
	cannot  map[string]bool
}

func (b *bundleSource) set(roots ...*x509.Certificate) string {
	fp := ca.TrustBundleFingerprint(roots)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.current = &relaypb.TrustBundle{RootsPem: ca.CertsPEM(roots...), Fingerprint: fp, Revision: int64(len(b.acks) + 1)}
	return fp
}

func (b *bundleSource) Current() *relaypb.TrustBundle {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.current
}

// Serving: the tests here deliver only during a rotation (Current).
func (b *bundleSource) Serving() *relaypb.TrustBundle { return nil }

func (b *bundleSource) Acknowledged(cluster string, can bool, ack *relaypb.TrustBundleAck) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !can {
		b.cannot[cluster] = true
		return
	}
	b.acks[ack.GetFingerprint()] = ack
}

func (b *bundleSource) ack(fp string) (*relaypb.TrustBundleAck, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	a, ok := b.acks[fp]
	return a, ok
}

func (b *bundleSource) cannotAck(cluster string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cannot[cluster]
}

// bundleWorld is a real relay server with a bundle source, an agent's
// credential manager bootstrapped against it, and the server's root.
func bundleWorld(t *testing.T) (*bundleSource, *servertest.Server, *identitytest.MemAgentSecrets, *identity.Manager, *x509.Certificate) {
	t.Helper()
	src := &bundleSource{acks: map[string]*relaypb.TrustBundleAck{}, cannot: map[string]bool{}}
	srv := servertest.New(t, servertest.Options{TrustBundles: src})
	secrets := identitytest.NewMemAgentSecrets(srv.RootsPEM, srv.Mint("cluster-1", time.Hour))
	m, _ := startManager(t, srv, secrets, "cluster-1")
	<-m.Ready()
	roots, err := ca.ParseTrustBundle(srv.RootsPEM)
	require.NoError(t, err)
	return src, srv, secrets, m, roots[0]
}

// runSession runs an agent session with cfg until the test ends.
func runSession(t *testing.T, cfg agent.SessionConfig) *agent.Session {
	t.Helper()
	sess, err := agent.NewSession(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = sess.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return sess
}

// Through a real relay server and a real agent session: a bundle with a
// new root beside the current one is stored and acknowledged over the
// session; one that would no longer verify the server is, after one
// reconnect (a new session's server might be under the new root, as at the
// end of a relay root rotation), refused, said so in the acknowledgement,
// and the agent keeps its roots and its session.
func TestAnAgentPinsANewRootDeliveredOverItsSessionAndRefusesOneThatDropsItsServer(t *testing.T) {
	src, srv, secrets, m, oldRoot := bundleWorld(t)
	next, err := ca.GenerateRelayCA(ca.GenerateConfig{})
	require.NoError(t, err)
	both := src.set(oldRoot, next.Root)
	sess := runSession(t, agent.SessionConfig{ServerAddress: srv.Addr, TLS: m.ClientTLS, TrustBundles: m, PingInterval: 200 * time.Millisecond})

	waitFor(t, 10*time.Second, "the acknowledgement of both roots", func() bool { _, ok := src.ack(both); return ok })
	a, _ := src.ack(both)
	assert.Empty(t, a.GetError())
	stored, err := secrets.Roots(context.Background())
	require.NoError(t, err)
	got, err := ca.ParseTrustBundle(stored)
	require.NoError(t, err)
	assert.Equal(t, both, ca.TrustBundleFingerprint(got), "the agent pins both roots")

	onlyNext := src.set(next.Root)
	waitFor(t, 10*time.Second, "the answer to a bundle without the server's root", func() bool { _, ok := src.ack(onlyNext); return ok })
	a, _ = src.ack(onlyNext)
	assert.Contains(t, a.GetError(), "does not verify the server")
	after, err := secrets.Roots(context.Background())
	require.NoError(t, err)
	assert.Equal(t, stored, after, "a refused bundle changed nothing")
	assert.True(t, sess.State().Connected, "the session goes on")
	assert.Equal(t, int64(1), sess.State().Reconnects, "one reconnect for the bundle, not one per offer")
	assert.False(t, src.cannotAck("cluster-1"))
}

// An agent that does not store bundles says so in Hello and is reported
// as unable to acknowledge: the server sends it nothing and never counts
// it as having acknowledged.
func TestAnAgentWithoutBundleSupportIsReportedNeverCountedAsAcknowledged(t *testing.T) {
	src, srv, _, m, oldRoot := bundleWorld(t)
	src.set(oldRoot)
	runSession(t, agent.SessionConfig{ServerAddress: srv.Addr, TLS: m.ClientTLS, PingInterval: 200 * time.Millisecond})
	waitFor(t, 10*time.Second, "the report", func() bool { return src.cannotAck("cluster-1") })
	time.Sleep(time.Second) // several pings: still nothing acknowledged
	src.mu.Lock()
	defer src.mu.Unlock()
	assert.Empty(t, src.acks)
}
