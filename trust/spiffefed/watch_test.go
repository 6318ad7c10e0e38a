package spiffefed_test

import (
	"context"
	"crypto/x509"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relaymesh/relaymesh/trust/spiffefed"
)

// recorder is a go-spiffe BundleWatcher that polls every 20ms and keeps
// every bundle it was given; its latest bundle is also the x509bundle
// Source an https_spiffe watch authenticates the endpoint with, as a
// federated peer does (SPIFFE Federation §5.2: validate with the latest
// bundle fetched).
type recorder struct {
	td   spiffeid.TrustDomain
	mu   sync.Mutex
	seen []*spiffebundle.Bundle
	errs int
}

func (r *recorder) NextRefresh(time.Duration) time.Duration { return 20 * time.Millisecond }
func (r *recorder) OnUpdate(b *spiffebundle.Bundle) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, b)
}
func (r *recorder) OnError(error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs++
}

func (r *recorder) latest() *spiffebundle.Bundle {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.seen) == 0 {
		return nil
	}
	return r.seen[len(r.seen)-1]
}

// GetX509BundleForTrustDomain is the x509bundle.Source of the latest
// bundle.
func (r *recorder) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	if b := r.latest(); b != nil && td == r.td {
		return b.X509Bundle(), nil
	}
	return nil, errors.New("no bundle yet")
}

// go-spiffe's WatchBundle, over https_web and over https_spiffe, follows a
// whole MultiRoot rotation published by the endpoint: old, old + new
// (while the https_spiffe endpoint's SVID moves to the new root), new —
// each step once, with rising sequences, and the https_spiffe watcher,
// bootstrapped with the old root only, never loses the endpoint.
func TestGoSPIFFEWatchersFollowARotationOverBothProfiles(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	oldRoot, newRoot, web := makeRoot(t, "old"), makeRoot(t, "new"), makeRoot(t, "web")
	e := &endpoint{now: t0}
	e.publish(t, members("ns/vm", certs(oldRoot), "east.example"))
	east := spiffeid.RequireTrustDomainFromString("east.example")

	ep := serveBothProfiles(t, e, web, oldRoot)
	webURL, pool, spiffeURL, endpointID, setSVID := ep.webURL, ep.pool, ep.spiffeURL, ep.id, ep.setSVID

	webW := &recorder{td: east}
	spiffeW := &recorder{td: east}
	bootstrap := &recorder{td: east}
	bootstrap.OnUpdate(spiffebundle.FromX509Authorities(east, certs(oldRoot)))
	// The https_spiffe watcher authenticates with what it last fetched,
	// the bootstrap bundle before that.
	source := sourceFunc(func(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
		if b, err := spiffeW.GetX509BundleForTrustDomain(td); err == nil {
			return b, nil
		}
		return bootstrap.GetX509BundleForTrustDomain(td)
	})
	done := make(chan error, 2)
	go func() {
		done <- federation.WatchBundle(ctx, east, webURL+spiffefed.PathPrefix+"east.example", webW, federation.WithWebPKIRoots(pool))
	}()
	go func() {
		done <- federation.WatchBundle(ctx, east, spiffeURL+spiffefed.PathPrefix+"east.example", spiffeW, federation.WithSPIFFEAuth(source, endpointID))
	}()
	holds := func(w *recorder, want []*x509.Certificate) func() bool {
		return func() bool {
			b := w.latest()
			return b != nil && assert.ObjectsAreEqual(sortedByDER(want), sortedByDER(b.X509Authorities()))
		}
	}
	steps := [][]*testCA{{oldRoot}, {oldRoot, newRoot}, {newRoot}}
	for i, roots := range steps {
		if i > 0 {
			e.publish(t, members("ns/vm", certs(roots...), "east.example"))
		}
		if i == 1 {
			// Intermediates from the new root (PropagatingNewIntermediate):
			// the endpoint's SVID too, while both roots are published.
			require.Eventually(t, holds(spiffeW, certs(roots...)), 10*time.Second, 10*time.Millisecond)
			setSVID(newRoot)
		}
		for name, w := range map[string]*recorder{"https_web": webW, "https_spiffe": spiffeW} {
			require.Eventually(t, holds(w, certs(roots...)), 10*time.Second, 10*time.Millisecond, "%s: step %d", name, i)
		}
	}
	cancel()
	for range 2 {
		require.ErrorIs(t, <-done, context.Canceled)
	}
	for name, w := range map[string]*recorder{"https_web": webW, "https_spiffe": spiffeW} {
		w.mu.Lock()
		require.Len(t, w.seen, 3, "%s: each step once (nothing else moves the bundle)", name)
		var last uint64
		for i, b := range w.seen {
			seq, ok := b.SequenceNumber()
			require.True(t, ok)
			assert.Greater(t, seq, last, "%s: update %d", name, i)
			last = seq
		}
		assert.Zero(t, w.errs, "%s: the endpoint was never lost", name)
		w.mu.Unlock()
	}
}

func sortedByDER(cs []*x509.Certificate) []*x509.Certificate {
	st, _ := spiffefed.Next(spiffefed.State{}, []spiffefed.Member{{VirtualMesh: "x", TrustDomain: "sort.example", Roots: cs}}, t0)
	return st.Bundles["sort.example"].Roots
}

type sourceFunc func(spiffeid.TrustDomain) (*x509bundle.Bundle, error)

func (f sourceFunc) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	return f(td)
}
