package dashboard

import (
	"crypto/x509"
	"encoding/json"
	"html"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rotatingPKI is the part of ca.RelayIssuers the dashboard reads, frozen
// in one state.
type rotatingPKI struct {
	chain, roots []*x509.Certificate
	generation   int
	state        ca.RootRotationState
	loaded       bool
}

func (p *rotatingPKI) Chain() []*x509.Certificate { return p.chain }
func (p *rotatingPKI) Roots() []*x509.Certificate { return p.roots }
func (p *rotatingPKI) Generation() int            { return p.generation }
func (p *rotatingPKI) LoadedRootRotation() (ca.RootRotationState, bool) {
	return p.state, p.loaded
}

// fixedPKI is a provided relay CA: no generation, no rotation.
type fixedPKI struct{ chain, roots []*x509.Certificate }

func (p *fixedPKI) Chain() []*x509.Certificate { return p.chain }
func (p *fixedPKI) Roots() []*x509.Certificate { return p.roots }

// relayPKIs are a relay CA in each phase of a root rotation, Old and New
// real roots with an issuing CA each.
func relayPKIs(t testing.TB) (old, next *ca.RelayCA, phases map[ca.RootPhase]*rotatingPKI) {
	t.Helper()
	old, err := ca.GenerateRelayCA(ca.GenerateConfig{})
	require.NoError(t, err)
	next, err = ca.GenerateRelayCA(ca.GenerateConfig{})
	require.NoError(t, err)
	oldFP, newFP := ca.RootFingerprint(old.Root), ca.RootFingerprint(next.Root)
	since := testNow.Add(-90 * time.Minute)
	st := func(p ca.RootPhase) ca.RootRotationState {
		return ca.RootRotationState{Phase: p, Old: oldFP, New: newFP, Revision: 2, Since: since}
	}
	phases = map[ca.RootPhase]*rotatingPKI{
		ca.RootIdle:        {chain: []*x509.Certificate{old.Issuer}, roots: []*x509.Certificate{old.Root}, generation: 3},
		ca.RootAddingNew:   {chain: []*x509.Certificate{old.Issuer}, roots: []*x509.Certificate{old.Root, next.Root}, generation: 3, state: st(ca.RootAddingNew), loaded: true},
		ca.RootSwitching:   {chain: []*x509.Certificate{next.Issuer}, roots: []*x509.Certificate{old.Root, next.Root}, generation: 3, state: st(ca.RootSwitching), loaded: true},
		ca.RootRemovingOld: {chain: []*x509.Certificate{next.Issuer}, roots: []*x509.Certificate{next.Root}, generation: 3, state: st(ca.RootRemovingOld), loaded: true},
	}
	return old, next, phases
}

// The Trust page's relay CA in every phase: its roots and what each does,
// the issuing CA's generation, and the agents that have not acknowledged
// the phase's bundle (refusals counted and carrying their reason).
func TestRelayTrustInEveryPhase(t *testing.T) {
	old, next, phases := relayPKIs(t)
	oldFP, newFP := ca.RootFingerprint(old.Root), ca.RootFingerprint(next.Root)
	clusters := demoWorld("", testNow).KubernetesClusters // cluster-1 connected, cluster-2 offline
	adding := phases[ca.RootAddingNew].state
	clusters[0].Annotations = map[string]string{ca.AnnotationRelayBundleRefused: "ab12: the agent does not handle trust bundles (upgrade it)"}

	assert.Nil(t, relayTrust(nil, clusters, testNow), "no relay PKI, no section")

	fixed := relayTrust(&fixedPKI{chain: []*x509.Certificate{old.Issuer}, roots: []*x509.Certificate{old.Root}}, clusters, testNow)
	require.NotNil(t, fixed)
	assert.False(t, fixed.Rotates)
	assert.Zero(t, fixed.Generation)
	assert.Equal(t, "Idle", fixed.Phase)

	idle := relayTrust(phases[ca.RootIdle], clusters, testNow)
	assert.True(t, idle.Rotates)
	assert.False(t, idle.Rotating)
	assert.Equal(t, 3, idle.Generation)
	assert.Equal(t, []RelayRootView{{Fingerprint: oldFP, Subject: old.Root.Subject.String(), NotAfter: old.Root.NotAfter.UTC(), Role: "root"}}, idle.Roots)
	assert.Equal(t, old.Issuer.Subject.String(), idle.IssuerSubject)
	assert.Empty(t, idle.Pending)
	assert.Equal(t, 2, idle.Acked)

	a := relayTrust(phases[ca.RootAddingNew], clusters, testNow)
	assert.True(t, a.Rotating)
	assert.Equal(t, "AddingNewRoot", a.Phase)
	assert.Equal(t, "1h 30m ago", a.SinceAgo)
	assert.Equal(t, ca.BundleFingerprint(adding.Effective().Bundle), a.Bundle)
	require.Len(t, a.Roots, 2)
	assert.Contains(t, a.Roots[0].Role, "old root of the rotation: still issues")
	assert.Contains(t, a.Roots[1].Role, "new root of the rotation, staged")
	require.Len(t, a.Pending, 2)
	assert.Equal(t, "cluster-1", a.Pending[0].Cluster, "connected first")
	assert.Contains(t, a.Pending[0].Reason, "refused: ab12: the agent does not handle trust bundles")
	assert.Contains(t, a.Pending[1].Reason, "offline")
	assert.Equal(t, 1, a.Refused)
	assert.Zero(t, a.Acked)
	assert.Contains(t, a.Next, "(Switching)")

	// cluster-1 acknowledges the bundle of Switching: only the offline one waits.
	sw := phases[ca.RootSwitching]
	clusters[0].Annotations = map[string]string{ca.AnnotationRelayBundleAck: ca.BundleFingerprint(sw.state.Effective().Bundle)}
	s := relayTrust(sw, clusters, testNow)
	assert.Equal(t, 1, s.Acked)
	assert.Zero(t, s.Refused)
	require.Len(t, s.Pending, 1)
	assert.Equal(t, "cluster-2", s.Pending[0].Cluster)
	assert.Contains(t, s.Roots[1].Role, "new root of the rotation: issues and serves")
	assert.Contains(t, s.Roots[0].Role, "old root of the rotation: still accepted")
	assert.Equal(t, next.Issuer.Subject.String(), s.IssuerSubject)

	r := relayTrust(phases[ca.RootRemovingOld], clusters, testNow)
	require.Len(t, r.Roots, 1)
	assert.Equal(t, newFP, r.Roots[0].Fingerprint)
	assert.Contains(t, r.Roots[0].Role, "the only one sent to the agents")
	assert.Len(t, r.Pending, 2, "the bundle of Switching is not the one of RemovingOldRoot")
}

// The Certificates page marks the relay roots' part in a rotation.
func TestCertificatesMarkTheRelayRootsOfARotation(t *testing.T) {
	old, next, phases := relayPKIs(t)
	notes := func(p RelayPKI) map[string]string {
		out := map[string]string{}
		for _, c := range certificates(certificateInput{relay: p, now: testNow}) {
			if c.Kind == KindRelayRoot {
				out[c.Serial] = c.Note
			}
		}
		return out
	}
	o, n := hexSerial(old.Root), hexSerial(next.Root) // the two roots share a subject
	idle := notes(phases[ca.RootIdle])
	assert.Equal(t, map[string]string{o: "fingerprint " + short(ca.RootFingerprint(old.Root))}, idle)
	a := notes(phases[ca.RootAddingNew])
	assert.Contains(t, a[n], "new root of the rotation, staged: sent to the agents, not yet issuing (phase AddingNewRoot)")
	assert.Contains(t, a[o], "old root of the rotation: still issues and serves (phase AddingNewRoot)")
	assert.Contains(t, notes(phases[ca.RootSwitching])[n], "issues and serves (phase Switching)")
	assert.Len(t, notes(phases[ca.RootRemovingOld]), 1)
}

// The Trust and Certificates pages with a relay CA in rotation render the
// agents' refusals and names as text, and the Trust API carries the relay
// section.
func TestRelayTrustPagesEscapeHostileStrings(t *testing.T) {
	_, _, phases := relayPKIs(t)
	for _, s := range hostile {
		t.Run(s, func(t *testing.T) {
			src := demoWorld(s, testNow)
			src.KubernetesClusters[0].Annotations = map[string]string{ca.AnnotationRelayBundleRefused: "ab12: " + s}
			d, err := New(Config{Namespace: "relaymesh", Source: src, Auth: tokenAuth{users: map[string]string{"viewer-token": "viewer"},
				allow: map[string]map[string]bool{"viewer": {"*": true}}}, Relay: phases[ca.RootAddingNew], AgentTTL: 24 * time.Hour,
				Clock: func() time.Time { return testNow }})
			require.NoError(t, err)
			srv := httptest.NewServer(d)
			t.Cleanup(srv.Close)
			for _, v := range []View{ViewTrust, ViewCertificates} {
				code, body, _ := get(t, srv, "/"+string(v), "viewer-token")
				require.Equal(t, http.StatusOK, code, body)
				checkMarkup(t, string(v), body)
				if v == ViewTrust {
					assert.Contains(t, body, html.EscapeString("refused: ab12: "+s))
					assert.Contains(t, body, html.EscapeString(src.KubernetesClusters[1].Name))
					assert.Contains(t, body, `<span data-relay="acked">0</span> of 2 agent(s) acknowledged`)
					assert.Contains(t, body, "1 refused")
				} else {
					assert.Contains(t, body, "staged: sent to the agents, not yet issuing (phase AddingNewRoot)")
				}
			}
			code, body, _ := get(t, srv, "/api/v1/trust", "viewer-token")
			require.Equal(t, http.StatusOK, code, body)
			assert.NotContains(t, body, "<script>")
			var resp struct {
				Data TrustPage `json:"data"`
			}
			require.NoError(t, json.Unmarshal([]byte(body), &resp))
			require.NotNil(t, resp.Data.Relay)
			assert.Equal(t, "AddingNewRoot", resp.Data.Relay.Phase)
			assert.Equal(t, "ab12: "+strings.ToValidUTF8(s, "\uFFFD"), resp.Data.Relay.Pending[0].Refused)
			assert.Len(t, resp.Data.VirtualMeshes, 1)
		})
	}
}
