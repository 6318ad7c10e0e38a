package dashboard

import (
	"sort"
	"time"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/internal/text"
)

// TrustPeers is the Trust page's federation peers: the foreign SPIFFE
// trust domains whose bundles the server imports (FederatedTrustDomains of
// its namespace), as the Lease holder last fetched them.
type TrustPeers struct {
	// Hidden names what the caller lacks to see the peers (Section
	// SectionFederationPeers); Peers is then empty.
	Hidden string `json:"hidden,omitempty"`
	// Unavailable says why the peers (or some) could not be read.
	Unavailable string      `json:"unavailable,omitempty"`
	Peers       []TrustPeer `json:"peers"`
	// Omitted counts the peers past maxPeers, left out.
	Omitted int `json:"omitted,omitempty"`
}

// TrustPeer is one FederatedTrustDomain. Every string is the object's,
// bounded (peerLimits): whoever may write its spec or status chooses it.
type TrustPeer struct {
	Name        string `json:"name"`
	TrustDomain string `json:"trustDomain"`
	Profile     string `json:"profile"`
	URL         string `json:"bundleEndpointURL"`
	// State is Pending, Current, Stale or Invalid ("Pending" when unset).
	State string `json:"state"`
	// Warning is true for a Stale or Invalid peer: its bundle is not
	// current, or there is none.
	Warning  bool   `json:"warning"`
	Error    string `json:"error,omitempty"`
	Sequence uint64 `json:"sequence"`
	// RefreshHint is the bundle's spiffe_refresh_hint, seconds.
	RefreshHint     int64           `json:"refreshHint,omitempty"`
	LastFetch       time.Time       `json:"lastFetch,omitzero"`
	LastFetchAgo    string          `json:"lastFetchAgo,omitempty"`
	LastAccepted    time.Time       `json:"lastAccepted,omitzero"`
	LastAcceptedAgo string          `json:"lastAcceptedAgo,omitempty"`
	Roots           []TrustPeerRoot `json:"roots"`
	// RootsOmitted counts the roots past maxPeerRoots, left out.
	RootsOmitted int `json:"rootsOmitted,omitempty"`
}

// TrustPeerRoot is one root of a peer's accepted bundle.
type TrustPeerRoot struct {
	Fingerprint string    `json:"fingerprint"`
	Subject     string    `json:"subject"`
	NotAfter    time.Time `json:"notAfter"`
}

// Bounds of what the Trust page shows of a FederatedTrustDomain, in bytes
// (the CRD's own limits, so an object the apiserver validated is shown
// whole) and items.
const (
	maxPeers       = 256
	maxPeerRoots   = 8   // status.roots
	maxPeerName    = 253 // metadata.name
	maxTrustDomain = 255 // spec.trustDomain
	maxPeerURL     = 2048
	maxPeerError   = 1024
	maxPeerSubject = 1024
	maxPeerField   = 64 // profile, state, fingerprint (SHA-256, hex)
)

// trustPeers builds the federation peers, by trust domain then name.
func trustPeers(ftds []networkingv1alpha1.FederatedTrustDomain, now time.Time) TrustPeers {
	out := TrustPeers{Peers: make([]TrustPeer, 0, min(len(ftds), maxPeers))}
	for _, f := range ftds {
		st := f.Status
		p := TrustPeer{Name: text.Truncate(f.Name, maxPeerName), TrustDomain: text.Truncate(f.Spec.TrustDomain, maxTrustDomain),
			Profile: text.Truncate(f.Spec.Profile, maxPeerField), URL: text.Truncate(f.Spec.BundleEndpointURL, maxPeerURL),
			State: text.Truncate(string(st.State), maxPeerField), Error: text.Truncate(st.Error, maxPeerError),
			Sequence: st.Sequence, RefreshHint: st.RefreshHint, Roots: []TrustPeerRoot{}}
		if p.State == "" {
			p.State = string(networkingv1alpha1.FederatedPending)
		}
		p.Warning = st.State == networkingv1alpha1.FederatedStale || st.State == networkingv1alpha1.FederatedInvalid
		if st.LastFetch != nil {
			p.LastFetch = st.LastFetch.UTC()
			p.LastFetchAgo = ago(p.LastFetch, now)
		}
		if st.LastAccepted != nil {
			p.LastAccepted = st.LastAccepted.UTC()
			p.LastAcceptedAgo = ago(p.LastAccepted, now)
		}
		for i, r := range st.Roots {
			if i == maxPeerRoots {
				p.RootsOmitted = len(st.Roots) - maxPeerRoots
				break
			}
			p.Roots = append(p.Roots, TrustPeerRoot{Fingerprint: text.Truncate(r.Fingerprint, maxPeerField),
				Subject: text.Truncate(r.Subject, maxPeerSubject), NotAfter: r.NotAfter.UTC()})
		}
		out.Peers = append(out.Peers, p)
	}
	sort.Slice(out.Peers, func(i, j int) bool {
		a, b := out.Peers[i], out.Peers[j]
		if a.TrustDomain != b.TrustDomain {
			return a.TrustDomain < b.TrustDomain
		}
		return a.Name < b.Name
	})
	if len(out.Peers) > maxPeers {
		out.Omitted = len(out.Peers) - maxPeers
		out.Peers = out.Peers[:maxPeers]
	}
	return out
}
