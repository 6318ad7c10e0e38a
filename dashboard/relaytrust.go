package dashboard

import (
	"crypto/x509"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
)

// RelayRotation is what a RelayPKI that rotates its own root says of it
// (ca.RelayIssuers, the generated relay CA): the issuing CA's generation
// and the relay root rotation this replica loaded, false outside one.
type RelayRotation interface {
	Generation() int
	LoadedRootRotation() (ca.RootRotationState, bool)
}

// TrustPage is the Trust page: the relay CA, each VirtualMesh's shared
// trust, then the federation peers.
type TrustPage struct {
	// Relay is nil when the dashboard has no relay PKI (Config.Relay).
	Relay         *RelayTrust `json:"relay,omitempty"`
	VirtualMeshes []TrustMesh `json:"virtualMeshes"`
	Peers         TrustPeers  `json:"federationPeers"`
}

// RelayTrust is the relay CA agents pin: its roots, its issuing CA and
// where a root rotation is, as this replica loaded it.
type RelayTrust struct {
	Roots          []RelayRootView `json:"roots"`
	IssuerSubject  string          `json:"issuerSubject,omitempty"`
	IssuerNotAfter time.Time       `json:"issuerNotAfter,omitzero"`
	// Generation is the issuing CA's (1, then one more at each renewal);
	// 0 when the relay CA does not say (a provided CA).
	Generation int `json:"generation,omitempty"`
	// Rotates is false for a relay CA whose root the server does not
	// rotate (--ca-cert, --ca-secret, --ca-config).
	Rotates    bool   `json:"rotates"`
	Phase      string `json:"phase"`
	Rotating   bool   `json:"rotating"`
	Revision   int    `json:"revision,omitempty"`
	RolledBack bool   `json:"rolledBack,omitempty"`
	// Since is when the phase began.
	Since    time.Time `json:"since,omitzero"`
	SinceAgo string    `json:"sinceAgo,omitempty"`
	OldRoot  string    `json:"oldRoot,omitempty"`
	NewRoot  string    `json:"newRoot,omitempty"`
	// Bundle is the fingerprint of the phase's bundle; Agents the
	// relay-mode agents, Acked those that acknowledged it, Pending the
	// others (connected first, each with why; refused ones carry the
	// agent's reason), Refused how many of them refused.
	Bundle  string                `json:"bundleFingerprint,omitempty"`
	Agents  int                   `json:"agents"`
	Acked   int                   `json:"acked"`
	Refused int                   `json:"refused"`
	Pending []ca.RootPendingAgent `json:"pending"`
	Next    string                `json:"next,omitempty"`
}

// RelayRootView is one relay root and its part in a rotation.
type RelayRootView struct {
	Fingerprint string    `json:"fingerprint"`
	Subject     string    `json:"subject"`
	NotAfter    time.Time `json:"notAfter"`
	// Role: "root" outside a rotation, else what it does in this phase
	// (relayRootRole).
	Role string `json:"role"`
}

// relayTrust builds the relay CA's part of the Trust page; nil without a
// relay PKI.
func relayTrust(relay RelayPKI, clusters []multiclusterv1alpha1.KubernetesCluster, now time.Time) *RelayTrust {
	if relay == nil {
		return nil
	}
	t := &RelayTrust{Phase: string(ca.RootIdle), Pending: []ca.RootPendingAgent{}}
	if chain := relay.Chain(); len(chain) > 0 {
		t.IssuerSubject, t.IssuerNotAfter = chain[0].Subject.String(), chain[0].NotAfter.UTC()
	}
	var st ca.RootRotationState
	loaded := false
	if r, ok := relay.(RelayRotation); ok {
		t.Rotates, t.Generation = true, r.Generation()
		st, loaded = r.LoadedRootRotation()
	}
	for _, c := range relay.Roots() {
		fp := ca.RootFingerprint(c)
		t.Roots = append(t.Roots, RelayRootView{Fingerprint: fp, Subject: c.Subject.String(), NotAfter: c.NotAfter.UTC(), Role: relayRootRole(st, loaded, fp)})
	}
	agents := ca.RootAgentRecords(clusters)
	t.Agents = len(agents)
	if !loaded || st.Phase == ca.RootIdle {
		t.Acked = t.Agents
		return t
	}
	t.Phase, t.Rotating, t.Revision, t.RolledBack = string(st.Phase), true, st.Revision, st.RolledBack
	t.OldRoot, t.NewRoot = st.Old, st.New
	if !st.Since.IsZero() {
		t.Since, t.SinceAgo = st.Since.UTC(), ago(st.Since, now)
	}
	t.Bundle = ca.BundleFingerprint(st.Effective().Bundle)
	t.Pending = ca.PendingRootAgents(agents, t.Bundle)
	t.Acked = t.Agents - len(t.Pending)
	for _, p := range t.Pending {
		if p.Connected && p.Refused != "" {
			t.Refused++
		}
	}
	t.Next = ca.RootRotationNext(st, ca.RootRequestNone, len(t.Pending))
	return t
}

// relayRootRole says what the relay root fp does in the rotation st.
func relayRootRole(st ca.RootRotationState, loaded bool, fp string) string {
	if !loaded || st.Phase == ca.RootIdle {
		return "root"
	}
	switch {
	case fp == st.New && st.Phase == ca.RootAddingNew:
		return "new root of the rotation, staged: sent to the agents, not yet issuing"
	case fp == st.New && st.Phase == ca.RootSwitching:
		return "new root of the rotation: issues and serves"
	case fp == st.New:
		return "new root of the rotation: the only one sent to the agents"
	case fp == st.Old && st.Phase == ca.RootAddingNew:
		return "old root of the rotation: still issues and serves"
	case fp == st.Old:
		return "old root of the rotation: still accepted, leaving after the grace window"
	}
	return "root of the rotation"
}

// relayRootNote is the Certificates page's note on a relay root.
func relayRootNote(relay RelayPKI, c *x509.Certificate) string {
	fp := ca.RootFingerprint(c)
	note := "fingerprint " + short(fp)
	if r, ok := relay.(RelayRotation); ok {
		if st, loaded := r.LoadedRootRotation(); loaded && st.Phase != ca.RootIdle {
			note += ", " + relayRootRole(st, loaded, fp) + " (phase " + string(st.Phase) + ")"
		}
	}
	return note
}
