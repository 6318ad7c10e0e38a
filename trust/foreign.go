package trust

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/trust/spiffefed"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// A VirtualMesh's spec.mtls.federatedTrustDomains reach its meshes as
// cross-certificates appended to the root bundle (root-cert.pem): the
// foreign root's subject and key, signed by the VirtualMesh root that
// issues intermediates now, name-constrained to the foreign trust domain
// (ca.CrossCertifyForeignRoot). Istio binds no root to a trust domain, so
// only the constraint keeps a foreign key from vouching for the meshes'
// own identities.
//
// The leader signs them and records them in status.sharedTrust.federation;
// every replica (the leader too) publishes what the status records, so all
// replicas hand agents the same bytes. A foreign root that its
// FederatedTrustDomain no longer carries, or a trust domain the spec no
// longer names, leaves the bundle on every replica at once; while the
// FederatedTrustDomain watch has not synced, what the status records
// stays (a restarted replica must not make every mesh drop and re-add
// them).

// foreignRoots are the roots of every FederatedTrustDomain of the server's
// namespace with an accepted bundle (Current or Stale), by trust domain;
// known is false while the watch has not synced (the CRD missing included).
func (c *Controller) foreignRoots() (roots map[string][]*x509.Certificate, known bool) {
	if c.ftds == nil || !c.ftds.HasSynced() {
		return nil, false
	}
	list, err := listTyped[networkingv1alpha1.FederatedTrustDomain](c.ftds)
	if err != nil {
		return nil, false
	}
	roots = map[string][]*x509.Certificate{}
	for _, f := range list {
		st := f.Status
		if (st.State != networkingv1alpha1.FederatedCurrent && st.State != networkingv1alpha1.FederatedStale) || st.TrustDomain == "" || st.TrustDomain != f.Spec.TrustDomain {
			continue
		}
		rs, err := spiffefed.ParseRoots([]byte(st.BundlePEM))
		if err != nil {
			c.log.Warn("a FederatedTrustDomain's stored bundle does not parse; none of its roots is delivered", "federated_trust_domain", f.Name, "error", err)
			continue
		}
		for _, r := range rs {
			if !slices.ContainsFunc(roots[st.TrustDomain], r.Equal) {
				roots[st.TrustDomain] = append(roots[st.TrustDomain], r)
			}
		}
	}
	// One order on every replica and every reconcile, whatever the
	// informer's; at most MaxRoots per trust domain (two objects of one
	// trust domain could hold more), so the status stays within its
	// bounds.
	for td, rs := range roots {
		slices.SortFunc(rs, func(a, b *x509.Certificate) int { return strings.Compare(Fingerprint(a), Fingerprint(b)) })
		roots[td] = rs[:min(len(rs), spiffefed.MaxRoots)]
	}
	return roots, true
}

// ownTrustDomains are the trust domains of this Relaymesh, lower-cased
// (name constraints match without case): every discovered mesh's, every
// one granted to a registered cluster, and the reserved ones. None is ever
// delivered as a foreign one, whatever a FederatedTrustDomain's status
// says: a grant made after its bundle was accepted included.
func (c *Controller) ownTrustDomains(in *translation.Input) map[string]bool {
	own := map[string]bool{}
	for _, td := range c.cfg.ReservedTrustDomains {
		own[strings.ToLower(td)] = true
	}
	for _, m := range in.Meshes {
		if m.Spec.Istio != nil && m.Spec.Istio.TrustDomain != "" {
			own[strings.ToLower(m.Spec.Istio.TrustDomain)] = true
		}
	}
	for i := range in.Clusters {
		for _, g := range in.Clusters[i].Grant() {
			own[strings.ToLower(g.Name)] = true
		}
	}
	return own
}

// foreignInputs are what the federation of every VirtualMesh reads in one
// reconcile: gathered once, for the first VirtualMesh that names or
// records a foreign trust domain, and not at all when none does.
type foreignInputs struct {
	in    *translation.Input
	ready bool
	own   map[string]bool                // ownTrustDomains
	roots map[string][]*x509.Certificate // foreignRoots
	known bool
}

func (c *Controller) gather(f *foreignInputs) {
	if !f.ready {
		f.own = c.ownTrustDomains(f.in)
		f.roots, f.known = c.foreignRoots()
		f.ready = true
	}
}

// federate appends to p's bundle the cross-certificates of the foreign
// trust domains p's VirtualMesh names, signing (on the leader) those the
// status does not record yet.
func (c *Controller) federate(ctx context.Context, p *vmPlan, leading bool, fi *foreignInputs) {
	if p.hold || p.bundle == nil {
		return
	}
	want := slices.Sorted(slices.Values(p.vm.Spec.MTLS.FederatedTrustDomains))
	want = slices.Compact(want)
	c.mu.Lock()
	var stored []networkingv1alpha1.FederatedTrustStatus
	if st := c.vmst[p.key]; st != nil {
		stored = slices.Clone(st.federation)
	}
	c.mu.Unlock()
	if len(want) == 0 && len(stored) == 0 {
		return
	}
	bundleRoots, err := spiffefed.ParseMeshRoots(p.bundle)
	if err != nil {
		c.log.Error("the root bundle does not parse; no foreign trust domain is delivered", "virtual_mesh", p.key, "error", err)
		return
	}
	c.gather(fi)
	own, foreign, known := fi.own, fi.roots, fi.known
	if leading && known {
		next := c.crossCertify(ctx, p, want, stored, foreign, bundleRoots, own)
		if !sameJSON(next, stored) && c.persist(ctx, p.key, func(n *vmState) { n.federation = next }) {
			stored = next
			c.log.Info("foreign trust domains delivered to the meshes changed", "virtual_mesh", p.key, "federation", describeFederation(next))
		}
	}
	for _, e := range stored {
		if e.CertificatePEM == "" || !slices.Contains(want, e.TrustDomain) || own[strings.ToLower(e.TrustDomain)] {
			continue
		}
		cross, issuer, ok := c.parseCross(e, bundleRoots)
		if !ok {
			continue
		}
		match := cross
		if known {
			i := slices.IndexFunc(foreign[e.TrustDomain], func(r *x509.Certificate) bool { return Fingerprint(r) == e.ForeignRootFingerprint })
			if i < 0 {
				continue // no longer in the foreign bundle
			}
			match = foreign[e.TrustDomain][i]
		}
		if err := ca.CheckForeignCrossCertificate(cross, match, issuer, e.TrustDomain, c.cfg.Clock()); err != nil {
			c.log.Warn("a recorded cross-certificate is not delivered", "virtual_mesh", p.key, "trust_domain", e.TrustDomain, "error", err)
			continue
		}
		p.bundle = append(slices.Clip(p.bundle), ca.CertsPEM(cross)...)
	}
}

// parseCross decodes e's certificate and finds the root of the bundle that
// issued it.
func (c *Controller) parseCross(e networkingv1alpha1.FederatedTrustStatus, bundle []*x509.Certificate) (cross, issuer *x509.Certificate, ok bool) {
	block, rest := pem.Decode([]byte(e.CertificatePEM))
	if block == nil || block.Type != "CERTIFICATE" || len(strings.TrimSpace(string(rest))) > 0 {
		return nil, nil, false
	}
	cross, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, nil, false
	}
	i := slices.IndexFunc(bundle, func(r *x509.Certificate) bool { return Fingerprint(r) == e.IssuerFingerprint })
	if i < 0 {
		return nil, nil, false // issued by a root the meshes no longer hold
	}
	return cross, bundle[i], true
}

// crossCertify is the federation status the leader records: for every
// foreign root of every wanted trust domain, the recorded
// cross-certificate from the issuing root, else a new one, else one from
// another root still in the bundle (a rotation's old root, while signing
// with the new one fails); for a trust domain with nothing, why.
func (c *Controller) crossCertify(ctx context.Context, p *vmPlan, want []string, stored []networkingv1alpha1.FederatedTrustStatus, foreign map[string][]*x509.Certificate, bundleRoots []*x509.Certificate, own map[string]bool) []networkingv1alpha1.FederatedTrustStatus {
	now := c.cfg.Clock()
	var out []networkingv1alpha1.FederatedTrustStatus
	none := func(td, why string) {
		out = append(out, networkingv1alpha1.FederatedTrustStatus{TrustDomain: td, Message: text.Truncate(why, 1024)})
	}
	for _, td := range want {
		switch {
		case len(p.ambient) > 0:
			none(td, fmt.Sprintf("not delivered: member meshes run ambient (%s), and ztunnel trusts one root only", strings.Join(p.ambient, ", ")))
			continue
		case own[strings.ToLower(td)]:
			none(td, fmt.Sprintf("not delivered: %s is this Relaymesh's own trust domain (a discovered mesh's, granted to a registered cluster, or the relay's); a foreign root must never vouch for its identities", td))
			continue
		case len(foreign[td]) == 0:
			none(td, fmt.Sprintf("not delivered: no FederatedTrustDomain in namespace %s has an accepted bundle (Current or Stale) of trust domain %s", c.cfg.Namespace, td))
			continue
		}
		for _, r := range foreign[td] {
			fp := Fingerprint(r)
			if i := slices.IndexFunc(bundleRoots, func(b *x509.Certificate) bool {
				return bytes.Equal(b.RawSubject, r.RawSubject) || bytes.Equal(b.RawSubjectPublicKeyInfo, r.RawSubjectPublicKeyInfo)
			}); i >= 0 {
				// A copy of our root's subject (or key) among the roots would
				// let verifiers that pick an issuer by name and never
				// backtrack (OpenSSL's, BoringSSL's) take it as the issuer
				// of the meshes' own intermediates.
				out = append(out, networkingv1alpha1.FederatedTrustStatus{TrustDomain: td, ForeignRootFingerprint: fp,
					Message: fmt.Sprintf("not delivered: the foreign root has the subject or key of the VirtualMesh root %s… (two Relaymeshes' VirtualMeshes of one name share a root subject: rename one)", ShortFingerprint(Fingerprint(bundleRoots[i])))})
				continue
			}
			recorded := func(issuer func(string) bool) (networkingv1alpha1.FederatedTrustStatus, bool) {
				for _, e := range stored {
					if e.TrustDomain == td && e.ForeignRootFingerprint == fp && e.CertificatePEM != "" && issuer(e.IssuerFingerprint) {
						if cross, iss, ok := c.parseCross(e, bundleRoots); ok && ca.CheckForeignCrossCertificate(cross, r, iss, td, now) == nil {
							return e, true
						}
					}
				}
				return networkingv1alpha1.FederatedTrustStatus{}, false
			}
			if e, ok := recorded(func(i string) bool { return i == p.issuer }); ok {
				out = append(out, e)
				continue
			}
			e, err := c.signCross(ctx, p, r, td, now)
			if err == nil {
				out = append(out, e)
				continue
			}
			c.log.Error("could not cross-certify a foreign root", "virtual_mesh", p.key, "trust_domain", td, "foreign_root", ShortFingerprint(fp), "error", err)
			if e, ok := recorded(func(string) bool { return true }); ok {
				out = append(out, e) // from a root the meshes still hold
				continue
			}
			out = append(out, networkingv1alpha1.FederatedTrustStatus{TrustDomain: td, ForeignRootFingerprint: fp,
				Message: text.Truncate("not delivered: "+err.Error(), 1024)})
		}
	}
	return out
}

// signCross cross-certifies foreign root r for td with the root p issues
// from, audited like every certificate the server issues: a record that
// cannot be written means no certificate.
func (c *Controller) signCross(ctx context.Context, p *vmPlan, r *x509.Certificate, td string, now time.Time) (networkingv1alpha1.FederatedTrustStatus, error) {
	if p.signer == nil || p.signer.fingerprint != p.issuer {
		return networkingv1alpha1.FederatedTrustStatus{}, errors.New("the root intermediates are issued from cannot be loaded now")
	}
	cross, err := ca.CrossCertifyForeignRoot(ctx, p.signer.signer, r, td, now)
	if err != nil {
		return networkingv1alpha1.FederatedTrustStatus{}, err
	}
	if err := c.cfg.Audit.Record(audit.Event{Type: audit.CertIssue, Result: audit.ResultSuccess, Subject: td, Serial: cross.SerialNumber.Text(16),
		Details: map[string]string{"kind": "foreign-root-cross-certificate", "virtualMesh": p.key, "foreignRoot": Fingerprint(r),
			"issuer": p.issuer, "notAfter": cross.NotAfter.UTC().Format(time.RFC3339)}}); err != nil {
		return networkingv1alpha1.FederatedTrustStatus{}, errors.New("the cross-certificate could not be audited; not delivered")
	}
	na := metav1.NewTime(cross.NotAfter)
	return networkingv1alpha1.FederatedTrustStatus{TrustDomain: td, ForeignRootFingerprint: Fingerprint(r), IssuerFingerprint: p.issuer,
		NotAfter: &na, CertificatePEM: string(ca.CertsPEM(cross))}, nil
}

// sameAcceptedBundle reports whether two versions of a FederatedTrustDomain
// (informer objects) deliver the same: trust domain, state and bundle.
func sameAcceptedBundle(o, n any) bool {
	ou, ok := o.(*unstructured.Unstructured)
	nu, ok2 := n.(*unstructured.Unstructured)
	if !ok || !ok2 {
		return false
	}
	for _, path := range [][]string{{"spec", "trustDomain"}, {"status", "trustDomain"}, {"status", "state"}, {"status", "bundlePEM"}} {
		a, _, _ := unstructured.NestedString(ou.Object, path...)
		b, _, _ := unstructured.NestedString(nu.Object, path...)
		if a != b {
			return false
		}
	}
	return true
}

// describeFederation is a log line's view of a federation status.
func describeFederation(es []networkingv1alpha1.FederatedTrustStatus) string {
	var parts []string
	for _, e := range es {
		if e.CertificatePEM != "" {
			parts = append(parts, fmt.Sprintf("%s root %s… via %s…", e.TrustDomain, ShortFingerprint(e.ForeignRootFingerprint), ShortFingerprint(e.IssuerFingerprint)))
		} else {
			parts = append(parts, e.TrustDomain+": "+e.Message)
		}
	}
	return strings.Join(parts, "; ")
}
