package main

import (
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/agent/apply"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/cmd/relaymesh/internal/registration"
	"github.com/relaymesh/relaymesh/examples"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
)

// Lifetimes of TestAgentsOfflineThroughARelayRootRotation: the shortest
// the server takes. Agent certificates of 45s (backdated a minute, so
// renewed every 0-10s); checks every second; the grace is the least
// --relay-root-grace accepts, 45s + 2 x 1s.
const (
	offlineAgentTTL = 45 * time.Second
	offlineCheck    = time.Second
	offlineGrace    = offlineAgentTTL + 2*offlineCheck
)

// relayRotation is `relaymesh ca relay rotate status -o json`.
func (w *world) relayRotation() ca.RootRotationStatus {
	w.t.Helper()
	out := w.mustRelaymesh("ca", "relay", "rotate", "status", "--context", "mgmt", "-o", "json")
	var st ca.RootRotationStatus
	require.NoError(w.t, json.Unmarshal([]byte(out), &st), out)
	return st
}

// waitPhase polls `ca relay rotate status` until the phase is want, and
// returns the phases it saw on the way.
func (w *world) waitPhase(timeout time.Duration, want ca.RootPhase) ([]ca.RootPhase, ca.RootRotationStatus) {
	w.t.Helper()
	var seen []ca.RootPhase
	var st ca.RootRotationStatus
	w.eventually(timeout, "relay root rotation phase "+string(want), func() (bool, string) {
		st = w.relayRotation()
		if len(seen) == 0 || seen[len(seen)-1] != st.Phase {
			seen = append(seen, st.Phase)
		}
		return st.Phase == want, fmt.Sprintf("phases %v", seen)
	})
	return seen, st
}

// ownedObjects is every object the agent of the cluster applied (its
// Istio objects and cacerts Secrets, by the owner label), as
// "Kind namespace/name" → "uid@resourceVersion".
func (w *world) ownedObjects(cluster string) map[string]string {
	w.t.Helper()
	dyn, err := dynamic.NewForConfig(w.env.Cluster(cluster).RESTConfig())
	require.NoError(w.t, err)
	sel := outputs.OwnerLabel + "=" + agentOwner
	out := map[string]string{}
	for _, gvk := range apply.DefaultKinds {
		l, err := dyn.Resource(registration.Resource(gvk)).Namespace("").List(w.ctx, metav1.ListOptions{LabelSelector: sel})
		if notFound(err) {
			continue // a kind this cluster does not serve
		}
		require.NoError(w.t, err, gvk.Kind)
		for _, o := range l.Items {
			out[gvk.Kind+" "+o.GetNamespace()+"/"+o.GetName()] = string(o.GetUID()) + "@" + o.GetResourceVersion()
		}
	}
	secrets, err := w.clients[cluster].CoreV1().Secrets("").List(w.ctx, metav1.ListOptions{LabelSelector: sel, FieldSelector: "metadata.name=" + trust.SecretName})
	require.NoError(w.t, err)
	for _, s := range secrets.Items {
		out["Secret "+s.Namespace+"/"+s.Name] = string(s.UID) + "@" + s.ResourceVersion
	}
	return out
}

// pinnedRoots are the relay roots the agent of the cluster pins
// (relay-root-tls-secret), by fingerprint.
func (w *world) pinnedRoots(cluster string) []string {
	w.t.Helper()
	s, err := w.clients[cluster].CoreV1().Secrets("relaymesh").Get(w.ctx, identity.RootSecret, metav1.GetOptions{})
	require.NoError(w.t, err)
	roots, err := ca.ParseTrustBundle(s.Data[identity.KeyCACert])
	require.NoError(w.t, err)
	var fps []string
	for _, r := range roots {
		fps = append(fps, ca.RootFingerprint(r))
	}
	return fps
}

// storedCert is the client certificate and its issuing CA the agent of the
// cluster stored (relay-client-tls-secret).
func (w *world) storedCert(cluster string) (leaf, issuer *x509.Certificate) {
	w.t.Helper()
	s, err := w.clients[cluster].CoreV1().Secrets("relaymesh").Get(w.ctx, identity.ClientSecret, metav1.GetOptions{})
	require.NoError(w.t, err)
	var chain []*x509.Certificate
	rest := s.Data["tls.crt"]
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		require.NoError(w.t, err)
		chain = append(chain, c)
	}
	require.GreaterOrEqual(w.t, len(chain), 2, "leaf and issuing CA")
	return chain[0], chain[1]
}

// tokenMints counts the server's token.mint audit records for the cluster.
func (w *world) tokenMints(cluster string) int {
	w.t.Helper()
	b, err := os.ReadFile(filepath.Join(w.dir, "audit.log"))
	require.NoError(w.t, err)
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, `"type":"token.mint"`) && strings.Contains(line, `"cluster":"`+cluster+`"`) {
			n++
		}
	}
	return n
}

// logSince is what the process wrote to its log after offset bytes.
func logSince(t *testing.T, p *proc, offset int64) string {
	t.Helper()
	b, err := os.ReadFile(p.log)
	require.NoError(t, err)
	return string(b[min(offset, int64(len(b))):])
}

func logSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if os.IsNotExist(err) {
		return 0
	}
	require.NoError(t, err)
	return fi.Size()
}

// TestAgentsOfflineThroughARelayRootRotation is issue 30's second "done
// when" with the real server and agents (`relaymesh server`, `relaymesh
// agent`, each run through the command line's own entry point) on local
// kube-apiservers, and a whole relay root rotation run through its real
// flags and `relaymesh ca relay rotate start|status`:
//
//   - the agent of cluster-1 (A) is stopped before `rotate start` and
//     started again in Switching, within the grace window: it reconnects
//     with the certificate it kept (no token: none is in its cluster, none
//     is minted), stores and acknowledges the bundle, renews under the new
//     root, and ends pinning only the new root once the old one left;
//   - the agent of cluster-2 (B) is stopped before `rotate start` too and
//     started only after the rotation is back at Idle, the old root gone.
//     Its certificate has expired by then — it must have: the old root
//     leaves at least the grace (an agent certificate lifetime and two
//     checks) after the switch, and B's certificate was issued before it —
//     so it meets the documented reason of an agent without a usable
//     certificate or token, naming `relaymesh cluster re-bootstrap
//     cluster-2`, in /readyz and its log. Re-bootstrap and the restart it
//     prints bring it back under the new root;
//   - the agent of cluster-3 (C) stays connected through AddingNewRoot and
//     Switching (pinning both roots, renewing under the new one) and is
//     away only for the few seconds in which the old root leaves
//     (RemovingOldRoot), as a restart or a network blip would make it. It
//     comes back at Idle with a valid certificate under the new root and
//     must end pinning only the new root too.
//
// Every cluster keeps what it had: the same KubernetesCluster (UID, spec,
// registry verdict), and every object its agent applied is the same
// object with the same resourceVersion, not re-created or rewritten.
//
// Found by this test, still open (the subtests "ends pinning only the new
// root" fail): the RemovingOldRoot → Idle step waits only for the agents
// connected at that moment, and at Idle a server offers no bundle. An agent
// not connected at that moment — C always; A when the one reconnect it
// makes for the bundle without the old root (errSessionPredatesBundle,
// about a second with the agent's default backoff) overlaps the Lease
// holder's check, 1 of 5 runs here — comes back at Idle and keeps pinning
// the retired root beside the new one until the next rotation. (A replica
// offering its roots at Idle too makes both pass: tried, not committed.)
func TestAgentsOfflineThroughARelayRootRotation(t *testing.T) {
	const a, b, c = "cluster-1", "cluster-2", "cluster-3"
	all := []string{a, b, c}
	start := time.Now()
	step := func(what string) { t.Logf("%6s %s", time.Since(start).Round(100*time.Millisecond), what) }
	w := baseWorld(t, all, offlineAgentTTL, func(w *world) {
		w.serverArgs = append(w.serverArgs, "--relay-issuer-check-interval", offlineCheck.String(), "--relay-root-grace", offlineGrace.String(),
			"--relay-root-renew-at", "0",
			// Certificates of 45s are renewed every 0-10s: more than
			// the default 6 a minute.
			"--cluster-renewals-per-minute", "60")
	})
	step("world up")
	sample, err := examples.Demo.ReadFile("demo/workload-cluster.yaml")
	require.NoError(t, err)
	for _, name := range all {
		_, err = w.env.Cluster(name).Apply(w.ctx, "test", []byte(strings.ReplaceAll(string(sample), "CLUSTER", name)))
		require.NoError(t, err)
		w.mustRelaymesh("cluster", "register", name, "--mgmt-context", "mgmt", "--remote-context", name, "--server-address", w.relayAddr)
		w.startAgent(name, time.Now)
	}
	for _, name := range all {
		w.waitConnected(name, true)
		_, err = w.env.Cluster("mgmt").Apply(w.ctx, "test", []byte(federatingVirtualMesh(name)))
		require.NoError(t, err)
	}
	cacerts := map[string]map[string][]byte{}
	applied := map[string]map[string]string{}
	for _, name := range all {
		cacerts[name] = w.cacerts(name)
		w.eventually(60*time.Second, name+"'s agent applied its outputs", func() (bool, string) {
			applied[name] = w.ownedObjects(name)
			policies := 0
			for k := range applied[name] {
				if strings.HasPrefix(k, "AuthorizationPolicy ") {
					policies++
				}
			}
			return policies > 0 && applied[name]["Secret istio-system/"+trust.SecretName] != "", fmt.Sprint(applied[name])
		})
	}
	step("agents connected, their outputs applied")
	oldRoots, err := ca.RelayRootsPEM(w.ctx, w.clients["mgmt"], "relaymesh")
	require.NoError(t, err)
	old, err := ca.ParseTrustBundle(oldRoots)
	require.NoError(t, err)
	require.Len(t, old, 1)
	oldFP := ca.RootFingerprint(old[0])
	mints := map[string]int{}
	for _, name := range all {
		mints[name] = w.tokenMints(name)
		require.Equal(t, 1, mints[name], "register minted one token for %s", name)
	}

	// A and B sleep; the rotation starts.
	before := map[string]*multiclusterv1alpha1.KubernetesCluster{c: w.cluster(c)}
	for _, name := range []string{a, b} {
		halt(t, w.agents[name])
		w.waitConnected(name, false)
		before[name] = w.cluster(name)
		_, err := w.clients[name].CoreV1().Secrets("relaymesh").Get(w.ctx, identity.TokenSecret, metav1.GetOptions{})
		require.True(t, notFound(err), "%s's token was spent at its bootstrap: %v", name, err)
	}
	require.Equal(t, ca.RootIdle, w.relayRotation().Phase)
	out := w.mustRelaymesh("ca", "relay", "rotate", "start", "--context", "mgmt")
	assert.Contains(t, out, "requested: relay root rotation start")
	step("A and B stopped, rotation requested")
	seen, st := w.waitPhase(60*time.Second, ca.RootSwitching)
	step(fmt.Sprintf("Switching (phases %v)", seen))
	require.NotNil(t, st.NewRoot)
	require.NotNil(t, st.Since)
	newFP := st.NewRoot.Fingerprint
	require.NotEqual(t, oldFP, newFP)
	assert.Equal(t, oldFP, st.OldRoot.Fingerprint)
	var pending []string
	for _, p := range st.Agents {
		pending = append(pending, p.Cluster)
		assert.False(t, p.Connected, p.Cluster)
		assert.Contains(t, p.Reason, "offline", p.Cluster)
	}
	assert.Equal(t, []string{a, b}, pending, "status names both sleeping agents (C acknowledged); neither held the rotation up")
	assert.ElementsMatch(t, []string{oldFP, newFP}, w.pinnedRoots(c), "C, connected, stored both roots")

	// A comes back within the grace window, with what it kept.
	assert.Equal(t, []string{oldFP}, w.pinnedRoots(a), "offline through AddingNewRoot: A pins only the old root")
	leaf, issuer := w.storedCert(a)
	require.True(t, time.Now().Before(leaf.NotAfter), "A's certificate is still valid (it expires %s)", leaf.NotAfter)
	require.NoError(t, issuer.CheckSignatureFrom(old[0]), "A's certificate is under the old root")
	w.startAgent(a, time.Now)
	w.waitConnected(a, true)
	require.Equal(t, ca.RootSwitching, w.relayRotation().Phase, "A reconnected within the grace window")
	step("A reconnected in Switching")
	w.eventually(30*time.Second, "A acknowledged both roots", func() (bool, string) {
		kc := w.cluster(a)
		pinned := w.pinnedRoots(a)
		return kc.Annotations[ca.AnnotationRelayBundleAck] == st.Bundle && len(pinned) == 2, fmt.Sprintf("ack %q, pinned %v", kc.Annotations[ca.AnnotationRelayBundleAck], pinned)
	})
	assert.ElementsMatch(t, []string{oldFP, newFP}, w.pinnedRoots(a))
	var newRoot *x509.Certificate
	for _, name := range []string{a, c} {
		w.eventually(30*time.Second, name+" renewed under the new root", func() (bool, string) {
			s, err := w.clients["mgmt"].CoreV1().Secrets("relaymesh").Get(w.ctx, ca.RootSecretName, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			_, staged, err := ca.RootRotationRoots(s)
			if err != nil || staged == nil {
				return false, fmt.Sprintf("staged root: %v", err)
			}
			newRoot = staged
			_, issuer := w.storedCert(name)
			return issuer.CheckSignatureFrom(staged) == nil, "still under the old root"
		})
	}
	require.Equal(t, newFP, ca.RootFingerprint(newRoot))
	step("A acknowledged; A and C renewed under the new root")

	// C goes away just before the grace ends, for the few seconds the
	// old root takes to leave: 5 s before, so that stopping it and the
	// status command after (a process each, slow on a loaded machine)
	// end before the phase moves.
	graceEnds := st.Since.Add(offlineGrace)
	require.True(t, time.Now().Before(graceEnds.Add(-7*time.Second)), "Switching went on too long for this test")
	time.Sleep(time.Until(graceEnds.Add(-5 * time.Second)))
	halt(t, w.agents[c])
	require.Equal(t, ca.RootSwitching, w.relayRotation().Phase, "C left before the old root started to leave")
	step("C stopped")

	// The old root leaves; the rotation ends at Idle.
	more, _ := w.waitPhase(offlineGrace+60*time.Second, ca.RootIdle)
	seen = append(seen, more...)
	step(fmt.Sprintf("Idle (phases %v)", seen))
	assert.Subset(t, seen, []ca.RootPhase{ca.RootAddingNew, ca.RootSwitching, ca.RootRemovingOld, ca.RootIdle})
	roots, err := ca.RelayRootsPEM(w.ctx, w.clients["mgmt"], "relaymesh")
	require.NoError(t, err)
	now, err := ca.ParseTrustBundle(roots)
	require.NoError(t, err)
	require.Len(t, now, 1, "the old root left")
	require.Equal(t, newFP, ca.RootFingerprint(now[0]))

	// C comes back with its certificate under the new root.
	leaf, issuer = w.storedCert(c)
	require.True(t, time.Now().Before(leaf.NotAfter), "C's certificate is still valid (it expires %s)", leaf.NotAfter)
	require.NoError(t, issuer.CheckSignatureFrom(now[0]), "C's certificate is under the new root")
	w.startAgent(c, time.Now)
	w.waitConnected(c, true)
	step("C reconnected at Idle")
	for _, name := range []string{a, c} {
		w.eventually(30*time.Second, name+" connected and ready", func() (bool, string) {
			errText, reason, err := w.agentReadyz(name)
			if err != nil {
				return false, err.Error()
			}
			return errText == "" && reason == "" && w.cluster(name).Status.Connected, errText
		})
		_, issuer = w.storedCert(name)
		assert.NoError(t, issuer.CheckSignatureFrom(now[0]), "%s's certificate is under the new root", name)
		assert.Contains(t, w.pinnedRoots(name), newFP, name)
		_, err = w.clients[name].CoreV1().Secrets("relaymesh").Get(w.ctx, identity.TokenSecret, metav1.GetOptions{})
		assert.True(t, notFound(err), "%s never needed a token: %v", name, err)
		assert.Equal(t, mints[name], w.tokenMints(name), "no token minted for %s", name)
	}

	// B comes back after the old root left. Its certificate expired
	// (see above), its token was spent: it cannot reach the server and
	// says so, naming the recovery.
	assert.Equal(t, []string{oldFP}, w.pinnedRoots(b), "B pins only the old root")
	leaf, _ = w.storedCert(b)
	require.False(t, time.Now().Before(leaf.NotAfter), "B's certificate (not after %s) expired before the old root left", leaf.NotAfter)
	offset := logSize(t, filepath.Join(w.dir, "agent-"+b+".log"))
	w.startAgent(b, time.Now)
	reason := "no valid client certificate and no bootstrap token"
	recovery := "`relaymesh cluster re-bootstrap " + b + "`"
	w.eventually(30*time.Second, "B's documented reason in /readyz", func() (bool, string) {
		errText, _, err := w.agentReadyz(b)
		if err != nil {
			return false, err.Error()
		}
		return strings.HasPrefix(errText, "no usable client certificate: ") && strings.Contains(errText, reason) && strings.Contains(errText, recovery), errText
	})
	step("B reports the reason")
	w.eventually(10*time.Second, "B logs the reason", func() (bool, string) {
		l := logSince(t, w.agents[b], offset)
		return strings.Contains(l, reason) && strings.Contains(l, recovery), lastLines(l, 5)
	})
	kc := w.cluster(b)
	assert.False(t, kc.Status.Connected, "B is not connected")
	assert.Equal(t, before[b].ResourceVersion, kc.ResourceVersion, "B's failing start writes nothing to its KubernetesCluster")

	// The documented recovery, then the restart it prints.
	pre := w.cluster(b)
	out = w.mustRelaymesh("cluster", "re-bootstrap", b, "--mgmt-context", "mgmt", "--remote-context", b)
	assert.Contains(t, out, "re-bootstrapped cluster "+b)
	assert.Contains(t, out, "kubectl -n relaymesh rollout restart deployment/relaymesh-agent")
	assert.Equal(t, pre.ResourceVersion, w.cluster(b).ResourceVersion, "re-bootstrap does not write the KubernetesCluster")
	assert.Equal(t, []string{newFP}, w.pinnedRoots(b), "re-bootstrap wrote the current root")
	assert.Equal(t, mints[b]+1, w.tokenMints(b), "one token minted, for B")
	w.restartAgentReady(b)
	step("B re-bootstrapped and reconnected")
	_, issuer = w.storedCert(b)
	assert.NoError(t, issuer.CheckSignatureFrom(now[0]), "B's certificate is under the new root")
	assert.Equal(t, []string{newFP}, w.pinnedRoots(b))
	_, err = w.clients[b].CoreV1().Secrets("relaymesh").Get(w.ctx, identity.TokenSecret, metav1.GetOptions{})
	assert.True(t, notFound(err), "B spent the new token: %v", err)

	// Nothing of any cluster's config or status was lost or re-created.
	for _, name := range all {
		kc := w.cluster(name)
		assert.Equal(t, before[name].UID, kc.UID, "%s: the same KubernetesCluster", name)
		assert.Equal(t, before[name].Generation, kc.Generation, "%s: its spec was not written", name)
		assert.Equal(t, before[name].Spec, kc.Spec, name)
		assert.Equal(t, before[name].Status.State, kc.Status.State, "%s: the registry's verdict kept", name)
		kept, err := w.clients[name].CoreV1().Secrets("istio-system").Get(w.ctx, trust.SecretName, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, cacerts[name], kept.Data, "%s: the mesh CA its agent applied is unchanged", name)
		w.eventually(30*time.Second, name+"'s applied objects settled", func() (bool, string) {
			got := w.ownedObjects(name)
			return len(got) == len(applied[name]), fmt.Sprint(got)
		})
		assert.Equal(t, applied[name], w.ownedObjects(name), "%s: every object its agent applied is the same object, not rewritten", name)
	}
	// B's annotations are kept, but for the trust bundle bookkeeping,
	// which a server may write when B answers a bundle.
	bundleNotes := func(m map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range m {
			if k != ca.AnnotationRelayBundleAck && k != ca.AnnotationRelayBundleRefused {
				out[k] = v
			}
		}
		return out
	}
	assert.Equal(t, bundleNotes(before[b].Annotations), bundleNotes(w.cluster(b).Annotations), "B's annotations kept")

	// The end state every agent must reach: the retired root pinned
	// nowhere. Open (see above): an agent not connected when the old root
	// left keeps pinning it.
	for _, tc := range []struct{ name, cluster string }{
		{"A, back in Switching, ends pinning only the new root", a},
		{"C, away only while the old root left, ends pinning only the new root", c},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer w.in(t)()
			w.eventually(15*time.Second, tc.cluster+" pins only the new root", func() (bool, string) {
				pinned := w.pinnedRoots(tc.cluster)
				return len(pinned) == 1 && pinned[0] == newFP, fmt.Sprintf("pins %v; the new root is %s, the retired one %s", pinned, newFP, oldFP)
			})
		})
	}
	step("done")
}
