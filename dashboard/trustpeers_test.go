package dashboard

import (
	"encoding/json"
	"html"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The federation peers show each FederatedTrustDomain as the Lease holder
// last wrote it, by trust domain: Current and Pending plain, Stale and
// Invalid marked as warnings with their error, and the last fetch and
// last acceptance with their age.
func TestTrustPeersInEveryState(t *testing.T) {
	at := func(d time.Duration) *metav1.Time {
		x := metav1.NewTime(testNow.Add(d))
		return &x
	}
	root := networkingv1alpha1.FederatedRoot{Fingerprint: strings.Repeat("ab", 32), Subject: "O=SPIRE,CN=root", NotAfter: *at(24 * time.Hour)}
	ftd := func(name, td string, st networkingv1alpha1.FederatedTrustDomainStatus) networkingv1alpha1.FederatedTrustDomain {
		return networkingv1alpha1.FederatedTrustDomain{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "relaymesh"},
			Spec:   networkingv1alpha1.FederatedTrustDomainSpec{TrustDomain: td, BundleEndpointURL: "https://" + td + "/bundle", Profile: "https_web"},
			Status: st}
	}
	got := trustPeers([]networkingv1alpha1.FederatedTrustDomain{
		ftd("stale", "d.example", networkingv1alpha1.FederatedTrustDomainStatus{State: networkingv1alpha1.FederatedStale, Error: "the answer is not a SPIFFE bundle",
			LastFetch: at(-time.Minute), LastAccepted: at(-3 * time.Hour), Sequence: 4, Roots: []networkingv1alpha1.FederatedRoot{root}}),
		ftd("current", "a.example", networkingv1alpha1.FederatedTrustDomainStatus{State: networkingv1alpha1.FederatedCurrent,
			LastFetch: at(-time.Minute), LastAccepted: at(-90 * time.Minute), Sequence: 5, RefreshHint: 300, Roots: []networkingv1alpha1.FederatedRoot{root}}),
		ftd("invalid", "c.example", networkingv1alpha1.FederatedTrustDomainStatus{State: networkingv1alpha1.FederatedInvalid,
			Error: "c.example is a trust domain of this Relaymesh", LastFetch: at(-time.Minute)}),
		ftd("new", "b.example", networkingv1alpha1.FederatedTrustDomainStatus{}),
	}, testNow)

	assert.Empty(t, got.Hidden)
	assert.Empty(t, got.Unavailable)
	assert.Zero(t, got.Omitted)
	require.Len(t, got.Peers, 4)
	names := []string{}
	for _, p := range got.Peers {
		names = append(names, p.Name)
	}
	assert.Equal(t, []string{"current", "new", "invalid", "stale"}, names, "by trust domain")

	want := map[string]TrustPeer{
		"current": {Name: "current", TrustDomain: "a.example", Profile: "https_web", URL: "https://a.example/bundle", State: "Current", Sequence: 5, RefreshHint: 300,
			LastFetch: at(-time.Minute).UTC(), LastFetchAgo: "1m 0s ago", LastAccepted: at(-90 * time.Minute).UTC(), LastAcceptedAgo: "1h 30m ago",
			Roots: []TrustPeerRoot{{Fingerprint: root.Fingerprint, Subject: root.Subject, NotAfter: root.NotAfter.UTC()}}},
		"new": {Name: "new", TrustDomain: "b.example", Profile: "https_web", URL: "https://b.example/bundle", State: "Pending", Roots: []TrustPeerRoot{}},
		"invalid": {Name: "invalid", TrustDomain: "c.example", Profile: "https_web", URL: "https://c.example/bundle", State: "Invalid", Warning: true,
			Error: "c.example is a trust domain of this Relaymesh", LastFetch: at(-time.Minute).UTC(), LastFetchAgo: "1m 0s ago", Roots: []TrustPeerRoot{}},
		"stale": {Name: "stale", TrustDomain: "d.example", Profile: "https_web", URL: "https://d.example/bundle", State: "Stale", Warning: true,
			Error: "the answer is not a SPIFFE bundle", Sequence: 4, LastFetch: at(-time.Minute).UTC(), LastFetchAgo: "1m 0s ago",
			LastAccepted: at(-3 * time.Hour).UTC(), LastAcceptedAgo: "3h 0m ago",
			Roots: []TrustPeerRoot{{Fingerprint: root.Fingerprint, Subject: root.Subject, NotAfter: root.NotAfter.UTC()}}},
	}
	for _, p := range got.Peers {
		assert.Equal(t, want[p.Name], p, p.Name)
	}
	assert.Equal(t, TrustPeers{Peers: []TrustPeer{}}, trustPeers(nil, testNow), "no peer: an empty list, not a hidden section")
}

// What a peer's spec and status say is bounded, whoever wrote it: long
// strings are cut (valid UTF-8, marked …), roots past the CRD's eight and
// peers past maxPeers are counted, not shown.
func TestTrustPeersAreBounded(t *testing.T) {
	long := strings.Repeat("é<", 4096) + "\xff"
	roots := make([]networkingv1alpha1.FederatedRoot, 12)
	for i := range roots {
		roots[i] = networkingv1alpha1.FederatedRoot{Fingerprint: long, Subject: long}
	}
	big := networkingv1alpha1.FederatedTrustDomain{ObjectMeta: metav1.ObjectMeta{Name: long},
		Spec:   networkingv1alpha1.FederatedTrustDomainSpec{TrustDomain: long, BundleEndpointURL: long, Profile: long},
		Status: networkingv1alpha1.FederatedTrustDomainStatus{State: networkingv1alpha1.FederatedTrustDomainState(long), Error: long, Roots: roots}}
	got := trustPeers([]networkingv1alpha1.FederatedTrustDomain{big}, testNow)
	require.Len(t, got.Peers, 1)
	p := got.Peers[0]
	for field, tc := range map[string]struct {
		s   string
		max int
	}{"name": {p.Name, maxPeerName}, "trust domain": {p.TrustDomain, maxTrustDomain}, "URL": {p.URL, maxPeerURL}, "profile": {p.Profile, maxPeerField},
		"state": {p.State, maxPeerField}, "error": {p.Error, maxPeerError}, "fingerprint": {p.Roots[0].Fingerprint, maxPeerField},
		"subject": {p.Roots[0].Subject, maxPeerSubject}} {
		assert.LessOrEqual(t, len(tc.s), tc.max, field)
		assert.True(t, strings.HasSuffix(tc.s, "…"), field)
		assert.NotContains(t, tc.s, "\xff", field)
	}
	assert.False(t, p.Warning, "a state the CRD does not know is no Stale or Invalid")
	assert.Len(t, p.Roots, maxPeerRoots)
	assert.Equal(t, 4, p.RootsOmitted)

	many := make([]networkingv1alpha1.FederatedTrustDomain, maxPeers+3)
	for i := range many {
		many[i] = networkingv1alpha1.FederatedTrustDomain{ObjectMeta: metav1.ObjectMeta{Name: strings.Repeat("p", i%7+1)}}
	}
	all := trustPeers(many, testNow)
	assert.Len(t, all.Peers, maxPeers)
	assert.Equal(t, 3, all.Omitted)
}

// failingPeers is a source whose FederatedTrustDomains cannot be read
// (its watch has not synced).
type failingPeers struct{ *StaticSource }

func (failingPeers) FederatedTrustDomains() ([]networkingv1alpha1.FederatedTrustDomain, error) {
	return nil, errPeersNotSynced
}

// The Trust page and its JSON show the federation peers, hostile strings
// of a peer's spec and status as text (a Stale peer's error marked as a
// warning); a viewer allowed the Trust page but not to list
// FederatedTrustDomains gets the page with the section saying what it
// needs and none of the peers' data; peers that cannot be read leave the
// rest of the page.
func TestFederationPeersEscapeHostileStrings(t *testing.T) {
	trustOnly := map[string]bool{"list multicluster.relaymesh.io/kubernetesclusters": true, "list networking.relaymesh.io/virtualmeshes": true}
	for _, s := range hostile {
		t.Run(s, func(t *testing.T) {
			src := demoWorld("", testNow)
			src.Peers = demoPeers(s, testNow)
			serve := func(src Source) *httptest.Server {
				d, err := New(Config{Namespace: "relaymesh", Source: src, Auth: tokenAuth{users: map[string]string{"viewer-token": "viewer", "trust-token": "trust"},
					allow: map[string]map[string]bool{"viewer": {"*": true}, "trust": trustOnly}}, Clock: func() time.Time { return testNow }})
				require.NoError(t, err)
				srv := httptest.NewServer(d)
				t.Cleanup(srv.Close)
				return srv
			}
			srv := serve(src)

			code, body, _ := get(t, srv, "/trust", "viewer-token")
			require.Equal(t, http.StatusOK, code, body)
			checkMarkup(t, "trust", body)
			assert.Contains(t, body, "<h2>Federation peers</h2>")
			for _, want := range []string{"spire.example" + s, "https://spire.example:8443/" + s, "Stale: refused: " + s} {
				assert.Contains(t, body, html.EscapeString(want))
			}
			assert.Contains(t, body, `class="wrap err" data-peer-field="error">Stale: refused: `, "a Stale peer's error is marked as an error")
			assert.Contains(t, body, `<span class="pill state-Stale" data-peer-field="state">Stale</span>`)
			assert.Contains(t, body, "(2h 0m ago)", "the last acceptance's age")
			assert.Contains(t, body, "c0ffee00c0ffee00…")

			code, body, _ = get(t, srv, "/api/v1/trust", "viewer-token")
			require.Equal(t, http.StatusOK, code, body)
			assert.NotContains(t, body, "<script>")
			var resp struct {
				Data TrustPage `json:"data"`
			}
			require.NoError(t, json.Unmarshal([]byte(body), &resp))
			peers := resp.Data.Peers
			require.Len(t, peers.Peers, 2)
			assert.Empty(t, peers.Hidden)
			assert.Equal(t, "refused: "+strings.ToValidUTF8(s, "\uFFFD"), peers.Peers[1].Error)
			assert.True(t, peers.Peers[1].Warning)
			assert.Equal(t, uint64(7), peers.Peers[0].Sequence)

			// Allowed the Trust page, not the peers.
			code, body, _ = get(t, srv, "/trust", "trust-token")
			require.Equal(t, http.StatusOK, code, body)
			checkMarkup(t, "trust", body)
			assert.Contains(t, body, "bookinfo-federation", "the rest of the page")
			assert.Contains(t, body, "Not visible to you: it needs list federatedtrustdomains.networking.relaymesh.io in namespace relaymesh.")
			assert.NotContains(t, body, "spire")
			assert.NotContains(t, body, "refused: ")
			code, body, _ = get(t, srv, "/api/v1/trust", "trust-token")
			require.Equal(t, http.StatusOK, code, body)
			assert.NotContains(t, body, "spire")
			require.NoError(t, json.Unmarshal([]byte(body), &resp))
			assert.Empty(t, resp.Data.Peers.Peers)
			assert.Contains(t, resp.Data.Peers.Hidden, "list federatedtrustdomains.networking.relaymesh.io")

			// Peers that cannot be read: the page, with the section saying so.
			code, body, _ = get(t, serve(failingPeers{src}), "/trust", "viewer-token")
			require.Equal(t, http.StatusOK, code, body)
			assert.Contains(t, body, "bookinfo-federation")
			assert.Contains(t, body, html.EscapeString("FederatedTrustDomains not read: "+errPeersNotSynced.Error()))
		})
	}
}

// ViewerRules grant every permission a view or one of its sections asks
// about: a viewer bound to the chart's role sees every section.
func TestViewerRulesGrantEveryViewAndSection(t *testing.T) {
	rules := ViewerRules()
	for _, v := range AllViews {
		attrs := Attributes(v, "relaymesh")
		for _, s := range sections[v] {
			attrs = append(attrs, SectionAttributes(s, "relaymesh")...)
		}
		for _, a := range attrs {
			granted := slices.ContainsFunc(rules, func(r rbacv1.PolicyRule) bool {
				return slices.Contains(r.APIGroups, a.Group) && slices.Contains(r.Resources, a.Resource) && slices.Contains(r.Verbs, a.Verb)
			})
			assert.True(t, granted, "%s: %s", v, needText(a))
		}
	}
}
