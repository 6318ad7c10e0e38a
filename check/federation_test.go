package check

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// ftd is a FederatedTrustDomain "spire" of relaymesh for spire.example
// with status st.
func ftd(st networkingv1alpha1.FederatedTrustDomainStatus) networkingv1alpha1.FederatedTrustDomain {
	return networkingv1alpha1.FederatedTrustDomain{
		ObjectMeta: metav1.ObjectMeta{Name: "spire", Namespace: "relaymesh", CreationTimestamp: metav1.NewTime(now.Add(-time.Hour))},
		Spec:       networkingv1alpha1.FederatedTrustDomainSpec{TrustDomain: "spire.example", BundleEndpointURL: "https://spire.example:8443", Profile: "https_web"},
		Status:     st,
	}
}

func at(d time.Duration) *metav1.Time { t := metav1.NewTime(now.Add(d)); return &t }

func peerRoot(notAfter time.Duration) networkingv1alpha1.FederatedRoot {
	return networkingv1alpha1.FederatedRoot{Fingerprint: strings.Repeat("ab", 32), Subject: "O=SPIRE,C=US", NotAfter: metav1.NewTime(now.Add(notAfter))}
}

// Each state and age of an imported trust domain gets one verdict, and
// every root's expiry is judged as a foreign certificate: warned of a
// week ahead, an error once expired.
func TestEvaluateFederationJudgesEachStateAgeAndRoot(t *testing.T) {
	day := 24 * time.Hour
	year := 365 * day
	current := func(mod func(*networkingv1alpha1.FederatedTrustDomainStatus)) networkingv1alpha1.FederatedTrustDomainStatus {
		st := networkingv1alpha1.FederatedTrustDomainStatus{State: networkingv1alpha1.FederatedCurrent, LastFetch: at(-time.Minute), LastAccepted: at(-time.Hour),
			Sequence: 7, RefreshHint: 300, Roots: []networkingv1alpha1.FederatedRoot{peerRoot(year), peerRoot(2 * year)}}
		if mod != nil {
			mod(&st)
		}
		return st
	}
	for _, tc := range []struct {
		name string
		st   networkingv1alpha1.FederatedTrustDomainStatus
		want Severity
		msgs []string
	}{
		{"current and fresh", current(nil), OK, []string{"trust domain spire.example: bundle current, sequence 7, 2 root(s), fetched 60s ago", "every 5m0s"}},
		{"current, fetched 10m ago with a 5m hint: within twice the interval plus a minute", current(func(s *networkingv1alpha1.FederatedTrustDomainStatus) { s.LastFetch = at(-10 * time.Minute) }), OK, []string{"bundle current"}},
		{"current, not fetched for 12m with a 5m hint", current(func(s *networkingv1alpha1.FederatedTrustDomainStatus) { s.LastFetch = at(-12 * time.Minute) }), Warning,
			[]string{"not fetched since 12m ago", "every 5m0s", "is the server's Lease holder running?", "spiffe-import"}},
		{"current, a 1s hint is clamped to 30s: 1m30s late is not overdue yet", current(func(s *networkingv1alpha1.FederatedTrustDomainStatus) {
			s.RefreshHint, s.LastFetch = 1, at(-90*time.Second)
		}), OK, []string{"every 30s"}},
		{"current, a huge hint is clamped to 1h", current(func(s *networkingv1alpha1.FederatedTrustDomainStatus) {
			s.RefreshHint, s.LastFetch = 1<<62, at(-3*time.Hour)
		}), Warning, []string{"every 1h0m0s"}},
		{"current without a hint: 5m", current(func(s *networkingv1alpha1.FederatedTrustDomainStatus) {
			s.RefreshHint, s.LastFetch = 0, at(-12*time.Minute)
		}), Warning, []string{"every 5m0s"}},
		{"current without lastFetch", current(func(s *networkingv1alpha1.FederatedTrustDomainStatus) { s.LastFetch = nil }), Warning, []string{"not fetched since never"}},
		{"current, no root listed", current(func(s *networkingv1alpha1.FederatedTrustDomainStatus) { s.Roots = nil }), Warning, []string{"lists no root"}},
		{"current, a root expires in 6 days", current(func(s *networkingv1alpha1.FederatedTrustDomainStatus) { s.Roots[1] = peerRoot(6 * day) }), Warning,
			[]string{"root abababababababab… (O=SPIRE,C=US) of trust domain spire.example expires in 6d", "the peer's next bundle should add a new root"}},
		{"current, a root with 20 days is fine", current(func(s *networkingv1alpha1.FederatedTrustDomainStatus) { s.Roots[1] = peerRoot(20 * day) }), OK, []string{"bundle current"}},
		{"current, a root expired", current(func(s *networkingv1alpha1.FederatedTrustDomainStatus) { s.Roots[0] = peerRoot(-time.Hour) }), Error,
			[]string{"of trust domain spire.example expired 60m ago", "the peer must rotate it"}},
		{"stale", current(func(s *networkingv1alpha1.FederatedTrustDomainStatus) {
			s.State, s.Error, s.LastAccepted = networkingv1alpha1.FederatedStale, "sequence 6 is lower than 7, the last accepted", at(-3*day)
		}), Warning, []string{"trust domain spire.example is Stale: the last fetch (60s ago", "refused: sequence 6 is lower than 7", "the bundle accepted 3d ago", "(sequence 7) is still trusted"}},
		{"stale and not fetched for an hour", current(func(s *networkingv1alpha1.FederatedTrustDomainStatus) {
			s.State, s.Error, s.LastFetch = networkingv1alpha1.FederatedStale, "status 503", at(-time.Hour)
		}), Warning, []string{"is Stale", "no fetch since", "Lease holder running?"}},
		{"stale with an expired root", current(func(s *networkingv1alpha1.FederatedTrustDomainStatus) {
			s.State, s.Roots[0] = networkingv1alpha1.FederatedStale, peerRoot(-day)
		}), Error, []string{"is Stale", "expired 24h ago"}},
		{"pending, fetched a minute ago", networkingv1alpha1.FederatedTrustDomainStatus{State: networkingv1alpha1.FederatedPending, Error: "dial tcp: connection refused", LastFetch: at(-time.Minute)},
			Warning, []string{"trust domain spire.example: no bundle accepted yet: dial tcp: connection refused (last fetch 60s ago"}},
		{"pending, last fetched 3m ago", networkingv1alpha1.FederatedTrustDomainStatus{State: networkingv1alpha1.FederatedPending, Error: "x509: unknown authority", LastFetch: at(-3 * time.Minute)},
			Warning, []string{"no bundle accepted yet: x509: unknown authority (last fetch 3m"}},
		{"pending, not retried for 20m", networkingv1alpha1.FederatedTrustDomainStatus{State: networkingv1alpha1.FederatedPending, Error: "status 404", LastFetch: at(-20 * time.Minute)},
			Warning, []string{"no bundle accepted yet: status 404", "no fetch since", "Lease holder running?"}},
		{"never fetched", networkingv1alpha1.FederatedTrustDomainStatus{}, Warning,
			[]string{"trust domain spire.example has never been fetched (the object was created 60m ago", "is the server's Lease holder running?", "spiffe-import"}},
		{"invalid", networkingv1alpha1.FederatedTrustDomainStatus{State: networkingv1alpha1.FederatedInvalid, Error: `trust domain "spire.example" is granted to cluster east`, LastFetch: at(-time.Minute)},
			Error, []string{`trust domain spire.example is Invalid: trust domain "spire.example" is granted to cluster east`, "fix the spec"}},
		{"invalid without a reason", networkingv1alpha1.FederatedTrustDomainStatus{State: networkingv1alpha1.FederatedInvalid}, Error, []string{"Invalid: no reason recorded"}},
		{"unknown state", networkingv1alpha1.FederatedTrustDomainStatus{State: "Exploded\n"}, Warning, []string{"in state Exploded , which this relaymesh does not know"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := find(Evaluate(&Observations{Namespace: "relaymesh", FederatedTrustDomains: []networkingv1alpha1.FederatedTrustDomain{ftd(tc.st)}}, now), AreaFederation, "")
			require.NotEmpty(t, rs)
			sev, msg := worst(rs)
			assert.Equal(t, tc.want, sev, msg)
			for _, r := range rs {
				assert.Equal(t, "relaymesh/spire", r.Subject, "the subject names the object")
			}
			for _, want := range tc.msgs {
				assert.Contains(t, msg, want)
			}
		})
	}
}

// A status is written by whoever may write it and quotes a peer: nothing
// of it reaches the terminal as more than one bounded, printable line.
func TestEvaluateFederationQuotesHostileStatusOnOneBoundedLine(t *testing.T) {
	hostile := "refused\n\x1b[2J\x1b]0;pwned\x07 \u202eevil\r\nFAKE: all ok\t" + strings.Repeat("A", 5000)
	f := ftd(networkingv1alpha1.FederatedTrustDomainStatus{State: networkingv1alpha1.FederatedStale, Error: hostile, LastFetch: at(-time.Minute), LastAccepted: at(-time.Hour),
		Roots: []networkingv1alpha1.FederatedRoot{{Fingerprint: hostile, Subject: hostile, NotAfter: metav1.NewTime(now.Add(time.Hour))}}})
	f.Name = "spire\nOK"
	f.Spec.TrustDomain = hostile
	invalid := f.DeepCopy()
	invalid.Name, invalid.Status.State = "invalid", networkingv1alpha1.FederatedInvalid
	roots := make([]networkingv1alpha1.FederatedRoot, 50)
	for i := range roots {
		roots[i] = peerRoot(time.Hour)
	}
	many := ftd(networkingv1alpha1.FederatedTrustDomainStatus{State: networkingv1alpha1.FederatedCurrent, LastFetch: at(-time.Minute), Roots: roots})
	many.Name = "many"
	rs := find(Evaluate(&Observations{Namespace: "relaymesh", FederatedTrustDomains: []networkingv1alpha1.FederatedTrustDomain{f, *invalid, many}}, now), AreaFederation, "")
	require.NotEmpty(t, rs)
	for _, r := range rs {
		for _, s := range []string{r.Subject, r.Message} {
			assert.False(t, strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }), "unprintable rune in %q", s)
		}
		assert.LessOrEqual(t, len(r.Message), 2000, r.Message)
	}
	assert.Len(t, find(rs, AreaFederation, "relaymesh/many"), 8+1, "at most MaxRoots roots are judged, beside the state")
	_, msg := worst(find(rs, AreaFederation, "relaymesh/invalid"))
	assert.Contains(t, msg, "is Invalid: refused  ")
	assert.Contains(t, msg, "AAA…")
}

// What cannot be listed is said to be unchecked, never passed over.
func TestEvaluateFederationUnlistableIsAWarningThatSaysUnchecked(t *testing.T) {
	gr := schema.GroupResource{Group: networkingv1alpha1.GroupVersion.Group, Resource: "federatedtrustdomains"}
	for _, tc := range []struct {
		name string
		err  error
		msg  string
	}{
		{"CRD not installed", apierrors.NewNotFound(gr, ""), "the FederatedTrustDomain CRD is not installed"},
		{"forbidden", apierrors.NewForbidden(gr, "", errors.New("RBAC")), "this run may not list FederatedTrustDomains in relaymesh"},
		{"other", errors.New("list federatedtrustdomains: conn reset\n\x1b[31m"), "cannot list the FederatedTrustDomains of relaymesh: list federatedtrustdomains: conn reset  [31m"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := find(Evaluate(&Observations{Namespace: "relaymesh", FederatedTrustDomainsErr: tc.err}, now), AreaFederation, "")
			require.Len(t, rs, 1)
			assert.Equal(t, Warning, rs[0].Severity)
			assert.Contains(t, rs[0].Message, tc.msg)
			assert.Contains(t, rs[0].Message, "not checked")
		})
	}
	assert.Empty(t, find(Evaluate(&Observations{Namespace: "relaymesh"}, now), AreaFederation, ""), "nothing imported: nothing to say")
}

// What a VirtualMesh's meshes hold of each foreign trust domain it names:
// delivered roots are OK (their cross-certificates judged like foreign
// certificates), a reason not to deliver or nothing recorded is a warning,
// and every quoted string stays on one bounded line.
func TestEvaluateFederationJudgesWhatReachedTheMeshes(t *testing.T) {
	day := 24 * time.Hour
	vm := networkingv1alpha1.VirtualMesh{ObjectMeta: metav1.ObjectMeta{Name: "shared", Namespace: "relaymesh"},
		Spec: networkingv1alpha1.VirtualMeshSpec{MTLS: &networkingv1alpha1.MTLSConfig{
			FederatedTrustDomains: []string{"spire.example", "soon.example", "gone.example", "refused.example", "quiet.example"}}},
		Status: networkingv1alpha1.VirtualMeshStatus{SharedTrust: &networkingv1alpha1.SharedTrustStatus{Federation: []networkingv1alpha1.FederatedTrustStatus{
			{TrustDomain: "spire.example", ForeignRootFingerprint: strings.Repeat("ab", 32), CertificatePEM: "x", NotAfter: at(365 * day)},
			{TrustDomain: "spire.example", ForeignRootFingerprint: strings.Repeat("cd", 32), CertificatePEM: "x", NotAfter: at(300 * day)},
			{TrustDomain: "soon.example", ForeignRootFingerprint: strings.Repeat("ef", 32), CertificatePEM: "x", NotAfter: at(2 * day)},
			{TrustDomain: "gone.example", ForeignRootFingerprint: strings.Repeat("01", 32), CertificatePEM: "x", NotAfter: at(-day)},
			{TrustDomain: "refused.example", Message: "not delivered: the root is cfssl's\n\x1b[31m" + strings.Repeat("x", 2000)},
		}}},
	}
	rs := find(Evaluate(&Observations{Namespace: "relaymesh", VirtualMeshes: []networkingv1alpha1.VirtualMesh{vm}}, now), AreaFederation, "relaymesh/shared")
	got := map[string]Result{}
	for _, r := range rs {
		for _, td := range vm.Spec.MTLS.FederatedTrustDomains {
			if strings.Contains(r.Message, "trust domain "+td) && got[td].Message == "" || (strings.Contains(r.Message, "trust domain "+td) && r.Severity > got[td].Severity) {
				got[td] = r
			}
		}
		assert.LessOrEqual(t, len(r.Message), 800, r.Message)
		assert.False(t, strings.ContainsFunc(r.Message, unicode.IsControl), "%q", r.Message)
	}
	assert.Equal(t, OK, got["spire.example"].Severity, got["spire.example"].Message)
	assert.Contains(t, got["spire.example"].Message, "2 root(s) cross-certified")
	assert.Equal(t, Warning, got["soon.example"].Severity, got["soon.example"].Message)
	assert.Equal(t, Error, got["gone.example"].Severity, got["gone.example"].Message)
	assert.Equal(t, Warning, got["refused.example"].Severity)
	assert.Contains(t, got["refused.example"].Message, "the root is cfssl's")
	assert.Equal(t, Warning, got["quiet.example"].Severity)
	assert.Contains(t, got["quiet.example"].Message, "nothing recorded")

	vm.Spec.MTLS.FederatedTrustDomains = nil
	assert.Empty(t, find(Evaluate(&Observations{Namespace: "relaymesh", VirtualMeshes: []networkingv1alpha1.VirtualMesh{vm}}, now), AreaFederation, "relaymesh/shared"), "a VirtualMesh that names none: nothing to say")
}
