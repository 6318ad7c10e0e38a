package ca_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/test/localcluster"
)

// world is one agent that acknowledges what it is told and renews under
// the root issued from, and replicas that loaded every revision: what the
// Lease holder would observe when every step went through.
type world struct {
	mu     sync.Mutex
	acked  string
	onRoot string
	behind bool
}

func (w *world) observe(_ context.Context, st ca.RootRotationState) ([]ca.AgentRootObservation, int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	a := ca.AgentRootObservation{Cluster: "c1", Connected: true, CanAcknowledge: true, Acked: w.acked, OnRoot: w.onRoot}
	if !w.behind {
		// The agent catches up at once.
		eff := st.Effective()
		w.acked, w.onRoot = ca.BundleFingerprint(eff.Bundle), eff.IssueFrom
		a.Acked, a.OnRoot = w.acked, w.onRoot
	}
	return []ca.AgentRootObservation{a}, st.Revision, nil
}

func rootFP(t *testing.T, cs kubernetes.Interface, ns, name string) string {
	t.Helper()
	s, err := cs.CoreV1().Secrets(ns).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	roots, err := ca.ParseTrustBundle(s.Data["ca.crt"])
	require.NoError(t, err)
	return ca.RootFingerprint(roots[0])
}

// TestRelayRootRotationInKubernetes drives the rotation's Secrets on a
// real kube-apiserver: a whole rotation ends with both relay CA secrets on
// the new root (and a relay CA that loads), a rollback from Switching
// ends on the old root with nothing of the new one left, and a state that
// does not decode changes nothing.
func TestRelayRootRotationInKubernetes(t *testing.T) {
	ctx := context.Background()
	_, cs, _ := localcluster.Management(t, "")
	newNS := func(t *testing.T, name string) string {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		require.NoError(t, err)
		_, err = ca.LoadOrCreateRelayCA(ctx, cs, name, ca.GenerateConfig{})
		require.NoError(t, err)
		return name
	}
	now := time.Now()
	clock := func() time.Time { return now }
	cfg := ca.RootStepConfig{CA: ca.GenerateConfig{Clock: clock}, Rotation: ca.RootRotationConfig{Grace: time.Minute}}
	step := func(t *testing.T, ns string, w *world) ca.RootDecision {
		t.Helper()
		d, err := ca.StepRootRotation(ctx, cs, ns, cfg, w.observe)
		require.NoError(t, err)
		return d
	}
	// loaded is what a replica starting now loads: its roots, the root of
	// the issuing CA it signs with, and the roots of the issuing CAs it
	// accepts agent certificates from.
	loaded := func(t *testing.T, ns string) (roots []string, issueUnder string, acceptedUnder []string) {
		t.Helper()
		s, err := ca.LoadOrCreateRelayCA(ctx, cs, ns, cfg.CA)
		require.NoError(t, err)
		for _, r := range s.Roots() {
			roots = append(roots, ca.RootFingerprint(r))
		}
		under := func(c *x509.Certificate) string {
			for _, r := range s.Roots() {
				if c.CheckSignatureFrom(r) == nil {
					return ca.RootFingerprint(r)
				}
			}
			return "none"
		}
		issueUnder = under(s.Chain()[0])
		set, ok := s.(ca.IssuerSet)
		require.True(t, ok)
		for _, c := range set.AcceptedIssuers() {
			acceptedUnder = append(acceptedUnder, under(c))
		}
		return roots, issueUnder, acceptedUnder
	}
	phaseOf := func(t *testing.T, ns string) ca.RootRotationState {
		s, err := cs.CoreV1().Secrets(ns).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
		require.NoError(t, err)
		st, _, err := ca.DecodeRootRotation(s)
		require.NoError(t, err)
		return st
	}

	t.Run("a whole rotation ends on the new root in both secrets", func(t *testing.T) {
		ns := newNS(t, "rootrot-whole")
		old := rootFP(t, cs, ns, ca.RootSecretName)
		w := &world{}
		before, err := cs.CoreV1().Secrets(ns).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
		require.NoError(t, err)
		d := step(t, ns, w)
		assert.Equal(t, ca.RootIdle, d.State.Phase)
		after, err := cs.CoreV1().Secrets(ns).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, before.ResourceVersion, after.ResourceVersion, "nothing to do writes nothing")

		require.NoError(t, ca.RequestRootRotation(ctx, cs, ns, ca.RootRequestStart))
		assert.ErrorContains(t, ca.RequestRootRotation(ctx, cs, ns, ca.RootRequestRollback), "already pending")
		assert.Equal(t, []ca.RootAction{ca.RootActStage}, step(t, ns, w).Actions)
		// Every later decision is made afresh from the Secret, as a new
		// Lease holder after a replica kill would.
		d = step(t, ns, w)
		require.Equal(t, ca.RootAddingNew, d.State.Phase)
		assert.Equal(t, time.Minute, phaseOf(t, ns).Grace, "the Secret records the deciding server's grace")
		next := d.State.New
		assert.NotEqual(t, old, next)
		assert.Equal(t, old, rootFP(t, cs, ns, ca.SigningSecretName), "issuance stays on the old root while it is added")
		roots, issue, accepted := loaded(t, ns)
		assert.ElementsMatch(t, []string{old, next}, roots, "AddingNewRoot: a replica trusts both roots")
		assert.Equal(t, old, issue, "AddingNewRoot: and issues under the old one")
		assert.ElementsMatch(t, []string{old, next}, accepted, "AddingNewRoot: and accepts an issuing CA under each")
		adding, err := ca.LoadOrCreateRelayCA(ctx, cs, ns, cfg.CA)
		require.NoError(t, err)
		st, rotating := adding.(*ca.RelayIssuers).LoadedRootRotation()
		assert.True(t, rotating, "AddingNewRoot: a replica reports the rotation it loaded")
		assert.Equal(t, []any{d.State.Phase, d.State.Old, d.State.New, d.State.Revision}, []any{st.Phase, st.Old, st.New, st.Revision})
		assert.Empty(t, adding.(*ca.RelayIssuers).CrossIssued(), "AddingNewRoot: issuance is on the old root, nothing is cross-issued")

		w.behind = true
		d = step(t, ns, w)
		assert.Equal(t, ca.RootAddingNew, d.State.Phase)
		assert.Equal(t, []string{"c1: has not acknowledged yet"}, d.Blocking)
		w.behind = false
		require.Equal(t, ca.RootSwitching, step(t, ns, w).State.Phase)
		assert.Equal(t, ca.RootSwitching, step(t, ns, w).State.Phase, "both roots stay for the grace window")
		roots, issue, accepted = loaded(t, ns)
		assert.ElementsMatch(t, []string{old, next}, roots)
		assert.Equal(t, next, issue, "Switching: a replica issues under the new root")
		assert.ElementsMatch(t, []string{old, next}, accepted)
		signer, err := ca.LoadOrCreateRelayCA(ctx, cs, ns, cfg.CA)
		require.NoError(t, err)
		authority, err := ca.New(ca.Config{Signer: signer})
		require.NoError(t, err)
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		served, err := authority.IssueServer(ctx, key.Public(), []string{"relay.test"}, nil)
		require.NoError(t, err, "Switching: the authority issues (template → sign → validate) under the new root")
		require.NoError(t, served.Certificate.CheckSignatureFrom(served.Chain[0]))
		underNext := false
		for _, r := range served.Roots {
			underNext = underNext || (ca.RootFingerprint(r) == next && served.Chain[0].CheckSignatureFrom(r) == nil)
		}
		assert.True(t, underNext, "the serving certificate's issuing CA is under the new root")
		cross := signer.(*ca.RelayIssuers).CrossIssued()
		require.Len(t, cross, 1, "Switching: the issuing CA is cross-issued by the old root")
		oldRoot := rootCert(t, served.Roots, old)
		assert.Error(t, verifies(served.Certificate, served.Chain, oldRoot), "without the cross-issued CA an agent pinning only the old root refuses the server")
		assert.NoError(t, verifies(served.Certificate, append(slices.Clone(served.Chain), cross...), oldRoot), "with it, it verifies the server")
		assert.NoError(t, verifies(served.Certificate, append(slices.Clone(served.Chain), cross...), rootCert(t, served.Roots, next)), "and an agent with the new root still does")
		tamper(t, cs, ns, "cross-issuer.crt", ca.CertsPEM(served.Chain[0]), func() {
			_, err := ca.LoadOrCreateRelayCA(ctx, cs, ns, cfg.CA)
			assert.ErrorIs(t, err, ca.ErrRootRotationState, "a cross-issued CA the old root did not sign: nothing is loaded")
		})
		now = now.Add(2 * time.Minute)
		require.Equal(t, ca.RootRemovingOld, step(t, ns, w).State.Phase)
		roots, issue, accepted = loaded(t, ns)
		assert.Equal(t, []string{next}, roots, "RemovingOldRoot: only the new root is trusted")
		assert.Equal(t, next, issue)
		assert.Equal(t, []string{next}, accepted)
		removing, err := ca.LoadOrCreateRelayCA(ctx, cs, ns, cfg.CA)
		require.NoError(t, err)
		assert.Empty(t, removing.(*ca.RelayIssuers).CrossIssued(), "RemovingOldRoot: the old root leaves the bundle, so does the cross-issued CA")
		d = step(t, ns, w)
		require.Equal(t, ca.RootIdle, d.State.Phase)
		assert.Equal(t, []ca.RootAction{ca.RootActDeleteOld}, d.Actions)

		assert.Equal(t, next, rootFP(t, cs, ns, ca.RootSecretName))
		assert.Equal(t, next, rootFP(t, cs, ns, ca.SigningSecretName))
		root, err := cs.CoreV1().Secrets(ns).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
		require.NoError(t, err)
		assert.ElementsMatch(t, []string{"ca.crt", "tls.key"}, keys(root.Data), "no staged material is left")
		loaded, err := ca.LoadOrCreateRelayCA(ctx, cs, ns, ca.GenerateConfig{})
		require.NoError(t, err, "the rotated relay CA loads")
		assert.Equal(t, next, ca.RootFingerprint(loaded.Roots()[0]))
		_, rotating = loaded.(*ca.RelayIssuers).LoadedRootRotation()
		assert.False(t, rotating, "Idle: no rotation is loaded")
		issuer := loaded.Chain()[0]
		require.NoError(t, issuer.CheckSignatureFrom(loaded.Roots()[0]))
	})

	t.Run("a rotation held past the staged issuing CA's renewal renews it and keeps what it issued accepted", func(t *testing.T) {
		ns := newNS(t, "rootrot-staged-renewal")
		defer func(was time.Time) { now = was }(now) // the next subtests verify at the wall clock
		short := cfg
		short.CA.IssuerTTL = time.Hour // renewed 40 minutes after it is made (2/3)
		stepShort := func(t *testing.T, w *world) ca.RootDecision {
			t.Helper()
			d, err := ca.StepRootRotation(ctx, cs, ns, short, w.observe)
			require.NoError(t, err)
			return d
		}
		rootSecret := func(t *testing.T) *corev1.Secret {
			t.Helper()
			s, err := cs.CoreV1().Secrets(ns).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
			require.NoError(t, err)
			return s
		}
		stagedIssuer := func(t *testing.T) *x509.Certificate {
			t.Helper()
			return pemCerts(t, rootSecret(t).Data["next-issuer.crt"])[0]
		}
		accepts := func(t *testing.T, c *x509.Certificate) bool {
			t.Helper()
			s, err := ca.LoadOrCreateRelayCA(ctx, cs, ns, cfg.CA)
			require.NoError(t, err)
			return slices.ContainsFunc(s.(ca.IssuerSet).AcceptedIssuers(), c.Equal)
		}
		old := rootFP(t, cs, ns, ca.RootSecretName)
		w := &world{behind: true}
		require.NoError(t, ca.RequestRootRotation(ctx, cs, ns, ca.RootRequestStart))
		stepShort(t, w)
		require.Equal(t, ca.RootAddingNew, stepShort(t, w).State.Phase)
		first := stagedIssuer(t)

		// Held in AddingNewRoot (the agent has not acknowledged) past the
		// staged issuing CA's renewal: renewed, and the replaced one, which
		// issued nothing, is not kept.
		now = now.Add(41 * time.Minute)
		d := stepShort(t, w)
		assert.Equal(t, ca.RootAddingNew, d.State.Phase)
		assert.Equal(t, []ca.RootAction{ca.RootActRenewStagedIssuer}, d.Actions)
		second := stagedIssuer(t)
		assert.False(t, second.Equal(first), "a new staged issuing CA")
		assert.NotContains(t, keys(rootSecret(t).Data), "next-previous.crt", "the replaced staged issuing CA issued nothing: not kept")
		assert.False(t, accepts(t, first))
		assert.Empty(t, stepShort(t, w).Actions, "renewed once, not at every step")

		// Switching issues from it; held there (the agent is still under
		// the old root) past its renewal: renewed, and the replaced one,
		// which issued, stays accepted.
		w.behind = false
		require.Equal(t, ca.RootSwitching, stepShort(t, w).State.Phase)
		signer, err := ca.LoadOrCreateRelayCA(ctx, cs, ns, cfg.CA)
		require.NoError(t, err)
		require.True(t, signer.Chain()[0].Equal(second), "Switching issues from the renewed staged issuing CA")
		w.behind, w.onRoot = true, old
		now = now.Add(41 * time.Minute)
		d = stepShort(t, w)
		assert.Equal(t, ca.RootSwitching, d.State.Phase)
		assert.Equal(t, []ca.RootAction{ca.RootActRenewStagedIssuer}, d.Actions)
		third := stagedIssuer(t)
		signer, err = ca.LoadOrCreateRelayCA(ctx, cs, ns, cfg.CA)
		require.NoError(t, err)
		assert.True(t, signer.Chain()[0].Equal(third), "issuance moves to the renewed one")
		assert.True(t, accepts(t, second), "the one it replaced issued: still accepted")
		assert.Len(t, signer.(*ca.RelayIssuers).CrossIssued(), 1, "and the renewed one is cross-issued by the old root")
		assert.NoError(t, third.CheckSignatureFrom(rootCert(t, signer.Roots(), d.State.New)))
		cross := signer.(*ca.RelayIssuers).CrossIssued()[0]
		assert.True(t, bytes.Equal(cross.RawSubjectPublicKeyInfo, third.RawSubjectPublicKeyInfo), "the cross-issued CA is the renewed one's key")

		// The rotation ends: what the staged root's replaced issuing CA
		// signed stays accepted under the new root.
		w.behind = false
		require.Equal(t, ca.RootRemovingOld, stepShort(t, w).State.Phase)
		require.Equal(t, ca.RootIdle, stepShort(t, w).State.Phase)
		assert.NotContains(t, keys(rootSecret(t).Data), "next-previous.crt")
		signing, err := cs.CoreV1().Secrets(ns).Get(ctx, ca.SigningSecretName, metav1.GetOptions{})
		require.NoError(t, err)
		prev := pemCerts(t, signing.Data["previous.crt"])
		assert.True(t, slices.ContainsFunc(prev, second.Equal), "previous issuing CAs of the new root")
		assert.True(t, accepts(t, second))
		signer, err = ca.LoadOrCreateRelayCA(ctx, cs, ns, cfg.CA)
		require.NoError(t, err)
		assert.True(t, signer.Chain()[0].Equal(third))
	})

	t.Run("a staged issuing CA that expired while no step ran is renewed, or discarded, by the next step", func(t *testing.T) {
		defer func(was time.Time) { now = was }(now)
		short := cfg
		short.CA.IssuerTTL = time.Hour
		stepShort := func(t *testing.T, ns string, w *world) ca.RootDecision {
			t.Helper()
			d, err := ca.StepRootRotation(ctx, cs, ns, short, w.observe)
			require.NoError(t, err)
			return d
		}
		ns := newNS(t, "rootrot-staged-expired")
		w := &world{behind: true}
		require.NoError(t, ca.RequestRootRotation(ctx, cs, ns, ca.RootRequestStart))
		stepShort(t, ns, w)
		require.Equal(t, ca.RootAddingNew, stepShort(t, ns, w).State.Phase)
		now = now.Add(2 * time.Hour) // every replica down past the staged issuing CA's end
		_, err := ca.LoadOrCreateRelayCA(ctx, cs, ns, cfg.CA)
		require.Error(t, err, "a replica does not load a rotation whose staged issuing CA expired")
		d := stepShort(t, ns, w)
		assert.Equal(t, []ca.RootAction{ca.RootActRenewStagedIssuer}, d.Actions)
		_, err = ca.LoadOrCreateRelayCA(ctx, cs, ns, cfg.CA)
		require.NoError(t, err, "renewed: replicas load the rotation again")
		w.behind = false
		require.Equal(t, ca.RootSwitching, stepShort(t, ns, w).State.Phase)

		// A staged root left in Idle by an unfinished step, its issuing CA
		// since expired: discarded, not a step that fails forever.
		ns = newNS(t, "rootrot-staged-left")
		require.NoError(t, ca.RequestRootRotation(ctx, cs, ns, ca.RootRequestStart))
		stepShort(t, ns, &world{})
		s, err := cs.CoreV1().Secrets(ns).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
		require.NoError(t, err)
		delete(s.Annotations, ca.AnnotationRootRequest)
		_, err = cs.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{})
		require.NoError(t, err)
		now = now.Add(2 * time.Hour)
		assert.Equal(t, []ca.RootAction{ca.RootActDiscard}, stepShort(t, ns, &world{}).Actions)
		s, err = cs.CoreV1().Secrets(ns).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
		require.NoError(t, err)
		assert.ElementsMatch(t, []string{"ca.crt", "tls.key"}, keys(s.Data))
	})

	t.Run("rollback from Switching ends on the old root with nothing of the new one", func(t *testing.T) {
		ns := newNS(t, "rootrot-rollback")
		old := rootFP(t, cs, ns, ca.RootSecretName)
		w := &world{}
		require.NoError(t, ca.RequestRootRotation(ctx, cs, ns, ca.RootRequestStart))
		step(t, ns, w)
		step(t, ns, w)
		require.Equal(t, ca.RootSwitching, step(t, ns, w).State.Phase)
		require.NoError(t, ca.RequestRootRotation(ctx, cs, ns, ca.RootRequestRollback))
		d := step(t, ns, w)
		require.Equal(t, ca.RootSwitching, d.State.Phase)
		assert.True(t, d.State.RolledBack)
		assert.Equal(t, old, d.State.Effective().IssueFrom, "issuance goes back to the old root at once")
		_, issue, accepted := loaded(t, ns)
		assert.Equal(t, old, issue, "a replica issues under the old root again")
		assert.Len(t, accepted, 2, "and still accepts the new root's issuing CA for the grace window")
		back, err := ca.LoadOrCreateRelayCA(ctx, cs, ns, cfg.CA)
		require.NoError(t, err)
		authority, err := ca.New(ca.Config{Signer: back})
		require.NoError(t, err)
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		served, err := authority.IssueServer(ctx, key.Public(), []string{"relay.test"}, nil)
		require.NoError(t, err)
		cross := back.(*ca.RelayIssuers).CrossIssued()
		require.Len(t, cross, 1, "rolled back in Switching: the old root's issuing CA is cross-issued by the new root")
		newRoot := rootCert(t, back.Roots(), d.State.Old)
		assert.NoError(t, verifies(served.Certificate, append(slices.Clone(served.Chain), cross...), newRoot), "an agent that pins only the new root verifies the server")
		now = now.Add(2 * time.Minute)
		require.Equal(t, ca.RootRemovingOld, step(t, ns, w).State.Phase)
		require.Equal(t, ca.RootIdle, step(t, ns, w).State.Phase)
		assert.Equal(t, old, phaseOf(t, ns).Old)
		assert.Equal(t, old, rootFP(t, cs, ns, ca.RootSecretName))
		assert.Equal(t, old, rootFP(t, cs, ns, ca.SigningSecretName))
		root, err := cs.CoreV1().Secrets(ns).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
		require.NoError(t, err)
		assert.ElementsMatch(t, []string{"ca.crt", "tls.key"}, keys(root.Data))
		_, err = ca.LoadOrCreateRelayCA(ctx, cs, ns, ca.GenerateConfig{})
		require.NoError(t, err)
	})

	t.Run("a state that does not decode changes nothing", func(t *testing.T) {
		ns := newNS(t, "rootrot-bad")
		for _, ann := range []map[string]string{
			{"relaymesh.io/root-rotation-phase": "Sideways", "relaymesh.io/root-rotation-old": "x", "relaymesh.io/root-rotation-new": "y", "relaymesh.io/root-rotation-revision": "1"},
			{"relaymesh.io/root-rotation-phase": "Idle", "relaymesh.io/root-rotation-old": "not-this-root", "relaymesh.io/root-rotation-revision": "1"},
			{"relaymesh.io/root-rotation-phase": "Idle", "relaymesh.io/root-rotation-revision": "many"},
			{ca.AnnotationRootRequest: "destroy"},
		} {
			s, err := cs.CoreV1().Secrets(ns).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
			require.NoError(t, err)
			s.Annotations = ann
			s, err = cs.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{})
			require.NoError(t, err)
			_, err = ca.StepRootRotation(ctx, cs, ns, cfg, (&world{}).observe)
			require.Error(t, err)
			assert.True(t, errors.Is(err, ca.ErrRootRotationState), "%v", err)
			after, err := cs.CoreV1().Secrets(ns).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, s.ResourceVersion, after.ResourceVersion, "nothing was written")
		}
		// A replica loads its CA despite a mistyped request, and refuses a
		// rotation phase whose staged root is missing.
		set := func(ann map[string]string) {
			s, err := cs.CoreV1().Secrets(ns).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
			require.NoError(t, err)
			s.Annotations = ann
			_, err = cs.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{})
			require.NoError(t, err)
		}
		set(map[string]string{ca.AnnotationRootRequest: "destroy"})
		_, err := ca.LoadOrCreateRelayCA(ctx, cs, ns, cfg.CA)
		require.NoError(t, err)
		cur := rootFP(t, cs, ns, ca.RootSecretName)
		set(map[string]string{"relaymesh.io/root-rotation-phase": "AddingNewRoot", "relaymesh.io/root-rotation-old": cur,
			"relaymesh.io/root-rotation-new": "0123", "relaymesh.io/root-rotation-revision": "2"})
		_, err = ca.LoadOrCreateRelayCA(ctx, cs, ns, cfg.CA)
		require.ErrorIs(t, err, ca.ErrRootRotationState)
	})
}

// pemCerts parses every certificate of b.
func pemCerts(t *testing.T, b []byte) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for block, rest := pem.Decode(b); block != nil; block, rest = pem.Decode(rest) {
		c, err := x509.ParseCertificate(block.Bytes)
		require.NoError(t, err)
		out = append(out, c)
	}
	require.NotEmpty(t, out, "no certificate")
	return out
}

// rootCert is the certificate among roots with fingerprint fp.
func rootCert(t *testing.T, roots []*x509.Certificate, fp string) *x509.Certificate {
	t.Helper()
	for _, r := range roots {
		if ca.RootFingerprint(r) == fp {
			return r
		}
	}
	require.FailNow(t, "no root with fingerprint "+fp)
	return nil
}

// verifies is what an agent pinning only root does with the chain a
// server presents: leaf, then intermediates.
func verifies(leaf *x509.Certificate, intermediates []*x509.Certificate, root *x509.Certificate) error {
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	roots.AddCert(root)
	for _, c := range intermediates {
		inter.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	return err
}

// tamper sets key of the relay root Secret in ns to value while check
// runs, then restores it.
func tamper(t *testing.T, cs kubernetes.Interface, ns, key string, value []byte, check func()) {
	t.Helper()
	ctx := context.Background()
	s, err := cs.CoreV1().Secrets(ns).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
	require.NoError(t, err)
	was := s.Data[key]
	s.Data[key] = value
	s, err = cs.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{})
	require.NoError(t, err)
	check()
	s.Data[key] = was
	_, err = cs.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{})
	require.NoError(t, err)
}
