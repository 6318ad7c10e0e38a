package dashboard

import (
	"crypto/x509"
	"fmt"
	"math"
	"sort"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/trust"
	"go.step.sm/crypto/pemutil"
)

// Warning bands of a certificate.
const (
	BandOK       = "ok"
	BandWarning  = "warning"
	BandCritical = "critical"
	BandExpired  = "expired"
)

// Thresholds of the bands. A renewed certificate (agents', mesh
// intermediates, the relay's serving certificate) is renewed at about two
// thirds of its life: with less than a third left its renewal is overdue
// (warning), with less than a tenth it is about to lapse (critical). A CA
// that no one renews (roots, the relay's issuing CA) warns 90 days ahead and
// is critical 30 days ahead, time to plan and run a rotation.
const (
	caWarning  = 90 * 24 * time.Hour
	caCritical = 30 * 24 * time.Hour
)

// Band says how close to expiry a certificate valid from notBefore (zero:
// unknown) to notAfter is at now. renewed says whether Relaymesh renews it
// by itself.
func Band(notBefore, notAfter, now time.Time, renewed bool) string {
	if !now.Before(notAfter) {
		return BandExpired
	}
	left := notAfter.Sub(now)
	if renewed && !notBefore.IsZero() && notAfter.After(notBefore) {
		life := notAfter.Sub(notBefore)
		switch {
		case left < life/10:
			return BandCritical
		case left < life/3:
			return BandWarning
		}
		return BandOK
	}
	switch {
	case left < caCritical:
		return BandCritical
	case left < caWarning:
		return BandWarning
	}
	return BandOK
}

// Certificate is one row of the certificate inventory.
type Certificate struct {
	// Kind: relay root, relay issuing CA, relay server, agent, mesh root,
	// mesh intermediate.
	Kind string `json:"kind"`
	// Owner is what it belongs to: a cluster, a VirtualMesh, a mesh.
	Owner     string    `json:"owner"`
	Subject   string    `json:"subject"`
	Issuer    string    `json:"issuer"`
	Serial    string    `json:"serial"`
	NotBefore time.Time `json:"notBefore,omitzero"`
	NotAfter  time.Time `json:"notAfter"`
	// DaysLeft is whole days until NotAfter (negative: expired).
	DaysLeft int    `json:"daysLeft"`
	Left     string `json:"left"`
	Band     string `json:"band"`
	// Backend is where a CA's key lives (generated, secret, cfssl,
	// stepca, pkcs11, provided).
	Backend string `json:"backend,omitempty"`
	Note    string `json:"note,omitempty"`
}

// Certificate kinds.
const (
	KindRelayRoot        = "relay root"
	KindRelayIssuer      = "relay issuing CA"
	KindRelayServer      = "relay server"
	KindAgent            = "agent"
	KindMeshRoot         = "mesh root"
	KindMeshIntermediate = "mesh intermediate"
)

// RelayPKI is the relay's own PKI as the server holds it (a ca.Signer).
type RelayPKI interface {
	// Chain is the issuing CA followed by intermediates up to the root.
	Chain() []*x509.Certificate
	// Roots are the trust anchors agents pin.
	Roots() []*x509.Certificate
}

// certificateInput is what the inventory is built from.
type certificateInput struct {
	relay    RelayPKI
	serving  *x509.Certificate
	clusters []multiclusterv1alpha1.KubernetesCluster
	vms      []networkingv1alpha1.VirtualMesh
	agentTTL time.Duration
	now      time.Time
}

// certificates builds the inventory, soonest expiry first.
func certificates(in certificateInput) []Certificate {
	var out []Certificate
	add := func(c Certificate, renewed bool) {
		c.Band = Band(c.NotBefore, c.NotAfter, in.now, renewed)
		c.DaysLeft = int(math.Floor(c.NotAfter.Sub(in.now).Hours() / 24))
		c.Left = left(c.NotAfter, in.now)
		out = append(out, c)
	}
	fromX509 := func(kind, owner string, c *x509.Certificate) Certificate {
		return Certificate{Kind: kind, Owner: owner, Subject: c.Subject.String(), Issuer: c.Issuer.String(), Serial: hexSerial(c),
			NotBefore: c.NotBefore.UTC(), NotAfter: c.NotAfter.UTC()}
	}
	issuer := ""
	if in.relay != nil {
		for i, c := range in.relay.Chain() {
			kind := KindRelayIssuer
			if i > 0 {
				kind = "relay intermediate CA"
			}
			if i == 0 {
				issuer = c.Subject.String()
			}
			add(fromX509(kind, "relay", c), false)
		}
		for _, c := range in.relay.Roots() {
			r := fromX509(KindRelayRoot, "relay", c)
			r.Note = relayRootNote(in.relay, c)
			add(r, false)
		}
	}
	if in.serving != nil {
		add(fromX509(KindRelayServer, "relay", in.serving), true)
	}
	for _, kc := range in.clusters {
		ac := kc.Status.AgentCertificate
		if ac == nil {
			continue
		}
		c := Certificate{Kind: KindAgent, Owner: kc.Name, Subject: ac.SPIFFEID, Issuer: issuer, Serial: ac.Serial, NotAfter: ac.NotAfter.UTC()}
		if in.agentTTL > 0 {
			c.NotBefore = c.NotAfter.Add(-in.agentTTL)
		}
		add(c, true)
	}
	for _, vm := range in.vms {
		key := vm.Namespace + "/" + vm.Name
		st := vm.Status.SharedTrust
		if st == nil {
			continue
		}
		roots := map[string]*x509.Certificate{} // fingerprint → certificate, where the status carries its PEM
		if r := vm.Status.Rotation; r != nil {
			for _, bundle := range []string{r.OldRoots, r.NewRoots} {
				certs, err := pemutil.ParseCertificateBundle([]byte(bundle))
				if err != nil {
					continue
				}
				for _, c := range certs {
					roots[trust.Fingerprint(c)] = c
				}
			}
		}
		subjects := map[string]string{}
		if st.RootFingerprint != "" {
			subjects[st.RootFingerprint] = st.RootSubject
		}
		for fp, c := range roots {
			subjects[fp] = c.Subject.String()
		}
		backend := backendOf(st.Root, vm.Spec.MTLS)
		if st.RootFingerprint != "" {
			c := Certificate{Kind: KindMeshRoot, Owner: key, Subject: st.RootSubject, Backend: backend, Note: "fingerprint " + short(st.RootFingerprint)}
			if x, ok := roots[st.RootFingerprint]; ok {
				c = fromX509(KindMeshRoot, key, x)
				c.Backend, c.Note = backend, "fingerprint "+short(st.RootFingerprint)
			} else {
				c.Serial = "—"
				c.Issuer = "—"
				if st.RootNotAfter != nil {
					c.NotAfter = st.RootNotAfter.UTC()
				}
			}
			if !c.NotAfter.IsZero() {
				add(c, false)
			}
		}
		// A root of a rotation in progress (or just finished) that is not
		// the one in force.
		for fp, x := range roots {
			if fp == st.RootFingerprint || !rotationKeeps(vm.Status.Rotation, fp) {
				continue
			}
			c := fromX509(KindMeshRoot, key, x)
			c.Backend, c.Note = "", "fingerprint "+short(fp)+", "+rotationRole(vm.Status.Rotation, fp)
			add(c, false)
		}
		for _, m := range st.Meshes {
			c := Certificate{Kind: KindMeshIntermediate, Owner: m.Cluster + " · " + m.Mesh, Subject: "intermediate CA of mesh " + m.Mesh,
				Issuer: subjects[m.Issuer], Serial: m.Serial, NotBefore: m.NotBefore.UTC(), NotAfter: m.NotAfter.UTC()}
			if m.TrustDomain != "" {
				c.Note = "signs spiffe://" + m.TrustDomain + "/… only"
			}
			if c.Issuer == "" {
				c.Issuer = "root " + short(m.Issuer)
			}
			add(c, true)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].NotAfter.Equal(out[j].NotAfter) {
			return out[i].NotAfter.Before(out[j].NotAfter)
		}
		return out[i].Kind+out[i].Owner < out[j].Kind+out[j].Owner
	})
	return out
}

// rotationKeeps says whether a root of the rotation's bundles is still one
// the meshes hold: during a rotation both; after it only the new (or, rolled
// back, the old).
func rotationKeeps(r *networkingv1alpha1.RotationStatus, fp string) bool {
	if r == nil {
		return false
	}
	switch r.Phase {
	case networkingv1alpha1.PhaseFinished:
		return fp == r.NewRootFingerprint
	case networkingv1alpha1.PhaseRolledBack:
		return fp == r.OldRootFingerprint
	}
	return true
}

func rotationRole(r *networkingv1alpha1.RotationStatus, fp string) string {
	switch fp {
	case r.NewRootFingerprint:
		return "new root of the rotation"
	case r.OldRootFingerprint:
		return "old root of the rotation"
	}
	return "root of the rotation"
}

// backendOf says where a VirtualMesh's root key lives.
func backendOf(src *networkingv1alpha1.RootSource, mtls *networkingv1alpha1.MTLSConfig) string {
	var r *networkingv1alpha1.RootCA
	switch {
	case src != nil:
		r = &src.RootCA
	case mtls != nil && mtls.Shared != nil:
		r = &mtls.Shared.RootCA
	default:
		return ""
	}
	switch {
	case r.Generated != nil:
		return "generated"
	case r.Secret != nil:
		return "secret"
	case r.External != nil:
		return r.External.Provider
	case r.PKCS11 != nil:
		return "pkcs11 (HSM)"
	}
	return ""
}

func hexSerial(c *x509.Certificate) string {
	if c.SerialNumber == nil {
		return ""
	}
	return fmt.Sprintf("%x", c.SerialNumber)
}

// left says how long until t, coarsely: "3d 4h", "5h 2m", "expired 2d ago".
func left(t, now time.Time) string {
	d := t.Sub(now)
	if d <= 0 {
		return "expired " + ago(t, now)
	}
	return coarse(d)
}

// ago says how long ago t was: "12s ago", "3m ago", "never".
func ago(t, now time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := now.Sub(t)
	if d < 0 {
		return "in " + coarse(-d)
	}
	return coarse(d) + " ago"
}

func coarse(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm %ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh %dm", int(d.Hours()), int(d.Minutes())%60)
	case d < 2*365*24*time.Hour:
		return fmt.Sprintf("%dd %dh", int(d.Hours())/24, int(d.Hours())%24)
	}
	return fmt.Sprintf("%dy %dd", int(d.Hours())/(24*365), (int(d.Hours())/24)%365)
}

// short is the start of a fingerprint, as relaymesh ca status shows it.
func short(fp string) string {
	if s := trust.ShortFingerprint(fp); s != fp {
		return s + "…"
	}
	return fp
}
