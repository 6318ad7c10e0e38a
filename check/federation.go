package check

import (
	"cmp"
	"fmt"
	"time"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/relaymesh/relaymesh/trust/spiffefed"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
)

// Imported foreign trust domains (FederatedTrustDomain,
// docs/spiffe-federation.md): the Lease holder fetches each one's bundle
// and writes the verdict into its status, which check judges here. Every
// string of a status is a peer's or an object writer's: each is quoted on
// one line, bounded (text.OneLine).

// FetchSlack is what a FederatedTrustDomain's last fetch may be late by
// beyond twice its fetch interval before check calls it overdue: the
// interval is the accepted bundle's refresh hint clamped as the importer
// clamps it (spiffefed.ClampRefresh), spiffefed.DefaultRefresh without
// one, so a Current bundle with a 5-minute hint is overdue after 11.
const FetchSlack = time.Minute

// Bounds of what check quotes of a FederatedTrustDomain.
const (
	maxPeerError   = 300 // status.error (the importer keeps 1024)
	maxTrustDomain = 255 // spec.trustDomain's schema bound
	maxRootSubject = 120
)

// evalFederation judges the FederatedTrustDomains of the server's
// namespace: Invalid is an error; Stale, Pending and an overdue fetch are
// warnings; each accepted root is judged as a foreign certificate
// (Lifetime.Foreign); a Current, fresh one is OK.
func evalFederation(o *Observations, now time.Time) []Result {
	subject := o.Namespace + "/federatedtrustdomains"
	var rs []Result
	switch err := o.FederatedTrustDomainsErr; {
	case err == nil:
		for i := range o.FederatedTrustDomains {
			rs = append(rs, evalFederatedTrustDomain(o.Namespace, &o.FederatedTrustDomains[i], now)...)
		}
	case apierrors.IsNotFound(err):
		rs = append(rs, result(AreaFederation, subject, Warning, "the FederatedTrustDomain CRD is not installed (see crds): imported foreign trust domains not checked"))
	case apierrors.IsForbidden(err):
		rs = append(rs, result(AreaFederation, subject, Warning, "this run may not list FederatedTrustDomains in %s: imported foreign trust domains not checked (grant list on federatedtrustdomains.networking.relaymesh.io)", o.Namespace))
	default:
		rs = append(rs, result(AreaFederation, subject, Warning, "cannot list the FederatedTrustDomains of %s: %s; imported foreign trust domains not checked", o.Namespace, text.OneLine(err.Error(), maxPeerError)))
	}
	for i := range o.VirtualMeshes {
		rs = append(rs, evalDelivery(&o.VirtualMeshes[i], now)...)
	}
	return rs
}

// evalDelivery judges what a VirtualMesh's meshes hold of each foreign
// trust domain its spec.mtls.federatedTrustDomains names, from
// status.sharedTrust.federation: nothing recorded, or a reason it was not
// delivered, is a warning; a cross-certificate is judged like a foreign
// certificate (it never outlives the foreign root).
func evalDelivery(vm *networkingv1alpha1.VirtualMesh, now time.Time) []Result {
	if vm.Spec.MTLS == nil || len(vm.Spec.MTLS.FederatedTrustDomains) == 0 {
		return nil
	}
	subject := text.OneLine(vm.Namespace+"/"+vm.Name, 253)
	var recorded []networkingv1alpha1.FederatedTrustStatus
	if st := vm.Status.SharedTrust; st != nil {
		recorded = st.Federation
	}
	var rs []Result
	for _, want := range vm.Spec.MTLS.FederatedTrustDomains {
		td := text.OneLine(want, maxTrustDomain)
		delivered := 0
		said := false
		for _, e := range recorded {
			if e.TrustDomain != want {
				continue
			}
			if e.CertificatePEM == "" || e.NotAfter == nil {
				said = true
				rs = append(rs, result(AreaFederation, subject, Warning, "foreign trust domain %s: %s", td, text.OneLine(cmp.Or(e.Message, "not delivered, no reason recorded"), maxPeerError)))
				continue
			}
			delivered++
			what := fmt.Sprintf("the cross-certificate of foreign root %s… of trust domain %s in the meshes' root-cert.pem", text.OneLine(e.ForeignRootFingerprint, 16), td)
			if sev, msg := Expiry(Lifetime{What: what, NotAfter: e.NotAfter.Time, Foreign: true}, now); sev != OK {
				rs = append(rs, result(AreaFederation, subject, sev, "%s: it expires with the foreign root (or the VirtualMesh root); the peer's next root is cross-certified once the import accepts it", msg))
			}
		}
		switch {
		case delivered > 0:
			rs = append(rs, result(AreaFederation, subject, OK, "foreign trust domain %s: %d root(s) cross-certified into the meshes' root-cert.pem", td, delivered))
		case !said:
			rs = append(rs, result(AreaFederation, subject, Warning, "foreign trust domain %s: nothing recorded in status.sharedTrust.federation yet (is the server's Lease holder running, and the VirtualMesh's root in force?)", td))
		}
	}
	return rs
}

func evalFederatedTrustDomain(namespace string, f *networkingv1alpha1.FederatedTrustDomain, now time.Time) []Result {
	subject := namespace + "/" + text.OneLine(f.Name, 253)
	td := text.OneLine(f.Spec.TrustDomain, maxTrustDomain)
	if td == "" {
		td = "(none)"
	}
	st := &f.Status
	reason := text.OneLine(st.Error, maxPeerError)
	if reason == "" {
		reason = "no reason recorded"
	}
	interval := fetchInterval(st.RefreshHint)
	overdue := st.LastFetch == nil || now.Sub(st.LastFetch.Time) > 2*interval+FetchSlack
	leaseHolder := fmt.Sprintf("is the server's Lease holder running? It fetches every FederatedTrustDomain of %s (its once-only task spiffe-import)", namespace)
	var rs []Result
	switch st.State {
	case networkingv1alpha1.FederatedInvalid:
		rs = append(rs, result(AreaFederation, subject, Error, "trust domain %s is Invalid: %s; nothing is fetched and no bundle is kept: fix the spec", td, reason))
	case networkingv1alpha1.FederatedStale:
		msg := fmt.Sprintf("trust domain %s is Stale: the last fetch (%s) was refused: %s; the bundle accepted %s (sequence %d) is still trusted", td, ago(st.LastFetch, now), reason, ago(st.LastAccepted, now), st.Sequence)
		if overdue {
			msg += fmt.Sprintf("; no fetch since, though one is due every %s at most: %s", interval, leaseHolder)
		}
		rs = append(rs, result(AreaFederation, subject, Warning, "%s", msg))
	case networkingv1alpha1.FederatedPending, "":
		if st.LastFetch == nil {
			rs = append(rs, result(AreaFederation, subject, Warning, "trust domain %s has never been fetched (the object was created %s): %s", td, ago(&f.CreationTimestamp, now), leaseHolder))
			break
		}
		msg := fmt.Sprintf("trust domain %s: no bundle accepted yet: %s (last fetch %s)", td, reason, ago(st.LastFetch, now))
		if overdue {
			msg += fmt.Sprintf("; no fetch since, though one is due every %s at most: %s", interval, leaseHolder)
		}
		rs = append(rs, result(AreaFederation, subject, Warning, "%s", msg))
	case networkingv1alpha1.FederatedCurrent:
		switch {
		case overdue:
			rs = append(rs, result(AreaFederation, subject, Warning, "trust domain %s: not fetched since %s, though its bundle asks for a fetch every %s: %s", td, ago(st.LastFetch, now), interval, leaseHolder))
		case len(st.Roots) == 0:
			rs = append(rs, result(AreaFederation, subject, Warning, "trust domain %s is Current, but its status lists no root: nothing of it is trusted", td))
		default:
			rs = append(rs, result(AreaFederation, subject, OK, "trust domain %s: bundle current, sequence %d, %d root(s), fetched %s (every %s)", td, st.Sequence, len(st.Roots), ago(st.LastFetch, now), interval))
		}
	default:
		rs = append(rs, result(AreaFederation, subject, Warning, "trust domain %s is in state %s, which this relaymesh does not know", td, text.OneLine(string(st.State), 32)))
	}
	for _, r := range st.Roots[:min(len(st.Roots), spiffefed.MaxRoots)] {
		what := fmt.Sprintf("root %s (%s) of trust domain %s", text.OneLine(r.Fingerprint, 16+len("…")), text.OneLine(r.Subject, maxRootSubject), td)
		switch sev, msg := Expiry(Lifetime{What: what, NotAfter: r.NotAfter.Time, Foreign: true}, now); sev {
		case OK:
		case Error:
			rs = append(rs, result(AreaFederation, subject, sev, "%s: the peer's identities it signed no longer verify; the peer must rotate it", msg))
		default:
			rs = append(rs, result(AreaFederation, subject, sev, "%s: its owner rotates it, so the peer's next bundle should add a new root", msg))
		}
	}
	return rs
}

// fetchInterval is how often the importer fetches after accepting a bundle
// with refresh hint hint (seconds, 0: none).
func fetchInterval(hint int64) time.Duration {
	switch {
	case hint <= 0:
		return spiffefed.DefaultRefresh
	case hint > int64(spiffefed.MaxRefresh/time.Second):
		return spiffefed.MaxRefresh // and no overflow
	}
	return spiffefed.ClampRefresh(time.Duration(hint) * time.Second)
}

// ago says when t was: "5m ago (RFC 3339)", "never" for nil or zero.
func ago(t *metav1.Time, now time.Time) string {
	if t == nil || t.IsZero() {
		return "never"
	}
	return fmt.Sprintf("%s ago (%s)", duration.HumanDuration(max(now.Sub(t.Time), 0)), t.UTC().Format(time.RFC3339))
}
