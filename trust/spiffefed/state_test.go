package spiffefed_test

import (
	"crypto/x509"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/trust/spiffefed"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

func members(vm string, roots []*x509.Certificate, tds ...string) []spiffefed.Member {
	var out []spiffefed.Member
	for _, td := range tds {
		out = append(out, spiffefed.Member{VirtualMesh: vm, TrustDomain: td, Roots: roots})
	}
	return out
}

func certs(cas ...*testCA) []*x509.Certificate {
	var out []*x509.Certificate
	for _, c := range cas {
		out = append(out, c.cert)
	}
	return out
}

// A MultiRoot rotation, phase by phase: the sequence of every trust domain
// of the VirtualMesh moves exactly when its bundle's roots change (steps
// 0→1 and 2→3, and back on a rollback), never on a step that keeps the
// roots, never backwards, and survives an encode/decode (a restart, or
// another replica reading the stored state).
func TestTheSequenceMovesExactlyWhenTheRootsChangeThroughARotation(t *testing.T) {
	oldRoot, newRoot := makeRoot(t, "old"), makeRoot(t, "new")
	tds := []string{"east.example", "west.example"}
	steps := []struct {
		name    string
		roots   []*x509.Certificate
		changes bool
	}{
		{"steady on the old root", certs(oldRoot), true},
		{"the same again (a reconcile, a restart)", certs(oldRoot), false},
		{"AddingNewRoot: old + new", certs(oldRoot, newRoot), true},
		{"PropagatingNewIntermediate: the same roots, in another order", certs(newRoot, oldRoot), false},
		{"DeletingOldRoot: the new only", certs(newRoot), true},
		{"Finished", certs(newRoot), false},
		{"rolled back to both (a rollback from step 3)", certs(oldRoot, newRoot), true},
		{"rolled back to the old only", certs(oldRoot), true},
	}
	var st spiffefed.State
	last := map[string]uint64{}
	for i, step := range steps {
		now := t0.Add(time.Duration(i) * time.Second) // changes faster than the clock are covered below
		next, rep := spiffefed.Next(st, members("ns/vm", step.roots, tds...), now)
		require.Empty(t, rep.Refused, step.name)
		// Round-trip through the stored form, as every replica reads it.
		data, err := spiffefed.Encode(next)
		require.NoError(t, err)
		st, err = spiffefed.Decode(data)
		require.NoError(t, err, step.name)
		for _, td := range tds {
			e := st.Bundles[td]
			if step.changes {
				assert.Greater(t, e.Sequence, last[td], "%s: %s gets a higher sequence", step.name, td)
				assert.Contains(t, rep.Changed, td, step.name)
			} else {
				assert.Equal(t, last[td], e.Sequence, "%s: %s keeps its sequence", step.name, td)
				assert.Empty(t, rep.Changed, step.name)
			}
			assert.ElementsMatch(t, step.roots, e.Roots, "%s: %s publishes exactly the step's roots", step.name, td)
			last[td] = e.Sequence
		}
	}
	// Many changes within one second still move forward.
	for i := range 5 {
		roots := certs(oldRoot)
		if i%2 == 0 {
			roots = certs(oldRoot, newRoot)
		}
		var rep spiffefed.Report
		st, rep = spiffefed.Next(st, members("ns/vm", roots, tds...), t0)
		require.Len(t, rep.Changed, 2)
		assert.Greater(t, st.Bundles[tds[0]].Sequence, last[tds[0]])
		last[tds[0]] = st.Bundles[tds[0]].Sequence
	}
}

// A trust domain removed and published again continues above its last
// sequence; a lost store (a new State) starts above the clock, so above
// every sequence given before it.
func TestASequenceNeverGoesBackwardsWhenATrustDomainReturnsOrTheStoreIsLost(t *testing.T) {
	r := certs(makeRoot(t, "r"))
	st, _ := spiffefed.Next(spiffefed.State{}, members("ns/vm", r, "a.example"), t0)
	first := st.Bundles["a.example"].Sequence
	assert.Equal(t, uint64(t0.Unix()), first)
	st, rep := spiffefed.Next(st, nil, t0.Add(time.Second))
	assert.Equal(t, []string{"a.example"}, rep.Removed)
	assert.Empty(t, st.Bundles)
	st, _ = spiffefed.Next(st, members("ns/vm", r, "a.example"), t0) // the clock even went back
	assert.Greater(t, st.Bundles["a.example"].Sequence, first)
	lost, _ := spiffefed.Next(spiffefed.State{}, members("ns/vm", r, "a.example"), t0.Add(time.Hour))
	assert.Greater(t, lost.Bundles["a.example"].Sequence, st.Bundles["a.example"].Sequence)
}

// Bundles of different trust domains are never merged, and a trust domain
// two VirtualMeshes claim with different roots is not published at all.
func TestTrustDomainsAreNeverMerged(t *testing.T) {
	a, b := makeRoot(t, "a"), makeRoot(t, "b")
	in := append(members("ns/vm-a", certs(a), "a.example", "shared.example"), members("ns/vm-b", certs(b), "b.example", "shared.example")...)
	st, rep := spiffefed.Next(spiffefed.State{}, in, t0)
	assert.Equal(t, []string{"a.example", "b.example"}, rep.Changed)
	require.Len(t, rep.Refused, 1)
	assert.Equal(t, "shared.example", rep.Refused[0].TrustDomain)
	assert.Contains(t, rep.Refused[0].Reason, "ns/vm-a, ns/vm-b")
	assert.Equal(t, certs(a), st.Bundles["a.example"].Roots)
	assert.Equal(t, certs(b), st.Bundles["b.example"].Roots)
	assert.NotContains(t, st.Bundles, "shared.example")

	// Published before, then claimed by a second VirtualMesh: removed.
	st, _ = spiffefed.Next(spiffefed.State{}, members("ns/vm-a", certs(a), "shared.example"), t0)
	require.Contains(t, st.Bundles, "shared.example")
	_, rep = spiffefed.Next(st, in, t0.Add(time.Second))
	assert.Equal(t, []string{"shared.example"}, rep.Removed)
}

// A held VirtualMesh (its root cannot be used, or it is Invalid for a
// while) keeps what is published for its trust domains.
func TestHeldTrustDomainsKeepTheirBundle(t *testing.T) {
	r := certs(makeRoot(t, "r"))
	st, _ := spiffefed.Next(spiffefed.State{}, members("ns/vm", r, "a.example", "b.example"), t0)
	before := st.Bundles
	held, rep := spiffefed.Next(st, members("ns/vm", nil, "a.example", "b.example"), t0.Add(time.Minute))
	assert.True(t, rep.Empty())
	assert.Equal(t, before, held.Bundles)
	invalid, rep := spiffefed.Next(st, []spiffefed.Member{{VirtualMesh: "ns/vm"}}, t0.Add(time.Minute))
	assert.True(t, rep.Empty(), "an Invalid VirtualMesh's held requests name no trust domain; its bundles stay")
	assert.Equal(t, before, invalid.Bundles)
	other, rep := spiffefed.Next(st, []spiffefed.Member{{VirtualMesh: "ns/other"}}, t0.Add(time.Minute))
	assert.ElementsMatch(t, []string{"a.example", "b.example"}, rep.Removed, "another VirtualMesh's hold keeps nothing of this one")
	assert.Empty(t, other.Bundles)
}

func TestNextRefusesInvalidTrustDomainsAndTooManyRoots(t *testing.T) {
	r := makeRoot(t, "r")
	many := make([]*x509.Certificate, spiffefed.MaxRoots+1)
	for i := range many {
		many[i] = makeRoot(t, "m").cert
	}
	in := []spiffefed.Member{
		{VirtualMesh: "ns/vm", TrustDomain: "Upper.Example", Roots: certs(r)},
		{VirtualMesh: "ns/vm", TrustDomain: "spiffe://a.example", Roots: certs(r)},
		{VirtualMesh: "ns/vm", TrustDomain: strings.Repeat("a", 256), Roots: certs(r)},
		{VirtualMesh: "ns/vm", TrustDomain: "many.example", Roots: many},
		{VirtualMesh: "ns/vm", TrustDomain: "ok.example", Roots: certs(r)},
	}
	st, rep := spiffefed.Next(spiffefed.State{}, in, t0)
	assert.Len(t, rep.Refused, 4)
	assert.Equal(t, []string{"ok.example"}, rep.Changed)
	assert.Len(t, st.Bundles, 1)
}

// The document is a SPIFFE bundle: a JWK Set whose keys carry the roots in
// x5c with use x509-svid, spiffe_sequence and spiffe_refresh_hint, and
// go-spiffe parses it back to the same roots.
func TestTheDocumentIsASPIFFEBundle(t *testing.T) {
	a, b := makeRoot(t, "a"), makeRoot(t, "b")
	st, _ := spiffefed.Next(spiffefed.State{}, members("ns/vm", certs(a, b), "a.example"), t0)
	doc, err := spiffefed.Document("a.example", st.Bundles["a.example"], 7*time.Minute)
	require.NoError(t, err)
	var raw struct {
		Keys []struct {
			Use string   `json:"use"`
			Kty string   `json:"kty"`
			X5c []string `json:"x5c"`
			Kid string   `json:"kid"`
		} `json:"keys"`
		Sequence    *uint64 `json:"spiffe_sequence"`
		RefreshHint *int64  `json:"spiffe_refresh_hint"`
	}
	require.NoError(t, json.Unmarshal(doc, &raw))
	require.Len(t, raw.Keys, 2)
	for _, k := range raw.Keys {
		assert.Equal(t, "x509-svid", k.Use)
		assert.Equal(t, "EC", k.Kty)
		assert.Len(t, k.X5c, 1)
	}
	require.NotNil(t, raw.Sequence)
	assert.Equal(t, st.Bundles["a.example"].Sequence, *raw.Sequence)
	require.NotNil(t, raw.RefreshHint)
	assert.Equal(t, int64(420), *raw.RefreshHint)
	parsed, err := spiffebundle.Parse(spiffeid.RequireTrustDomainFromString("a.example"), doc)
	require.NoError(t, err)
	assert.ElementsMatch(t, certs(a, b), parsed.X509Authorities())
}

// A stored state that is not what Encode makes is refused whole.
func TestDecodeRefusesWhatEncodeWouldNotMake(t *testing.T) {
	r := makeRoot(t, "r")
	st, _ := spiffefed.Next(spiffefed.State{}, members("ns/vm", certs(r), "a.example"), t0)
	good, err := spiffefed.Encode(st)
	require.NoError(t, err)
	leafChain, _ := r.svid(t, "spiffe://a.example/x")
	leafPEM := pemOf(leafChain[0])
	rootPEM := pemOf(r.cert)
	seq := st.Bundles["a.example"].Sequence
	for name, data := range map[string]string{
		"empty":                               "",
		"not JSON":                            "{",
		"trailing data":                       string(good) + "{}",
		"unknown field":                       `{"version":1,"counter":5,"bundles":{},"extra":1}`,
		"another version":                     `{"version":2,"counter":5,"bundles":{}}`,
		"a bad trust domain":                  `{"version":1,"counter":5,"bundles":{"A.example":{"sequence":1,"roots":` + jsonString(rootPEM) + `}}}`,
		"a sequence of 0":                     `{"version":1,"counter":5,"bundles":{"a.example":{"sequence":0,"roots":` + jsonString(rootPEM) + `}}}`,
		"a sequence over counter":             `{"version":1,"counter":5,"bundles":{"a.example":{"sequence":6,"roots":` + jsonString(rootPEM) + `}}}`,
		"no roots":                            `{"version":1,"counter":5,"bundles":{"a.example":{"sequence":1,"roots":""}}}`,
		"a leaf, not a CA":                    `{"version":1,"counter":5,"bundles":{"a.example":{"sequence":1,"roots":` + jsonString(leafPEM) + `}}}`,
		"a key":                               `{"version":1,"counter":5,"bundles":{"a.example":{"sequence":1,"roots":"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"}}}`,
		"garbage after the PEM":               `{"version":1,"counter":5,"bundles":{"a.example":{"sequence":1,"roots":` + jsonString(rootPEM+"junk") + `}}}`,
		"oversized":                           `{"version":1,"counter":5,"bundles":{},"pad":"` + strings.Repeat("x", spiffefed.MaxStateBytes) + `"}`,
		"a publish time that is not RFC 3339": `{"version":1,"counter":5,"bundles":{"a.example":{"sequence":1,"roots":` + jsonString(rootPEM) + `,"published":"yesterday"}}}`,
		"a publish time with fractions":       `{"version":1,"counter":5,"bundles":{"a.example":{"sequence":1,"roots":` + jsonString(rootPEM) + `,"published":"2026-12-03T10:00:00.5Z"}}}`,
		"a publish time with a zone":          `{"version":1,"counter":5,"bundles":{"a.example":{"sequence":1,"roots":` + jsonString(rootPEM) + `,"published":"2026-12-03T10:00:00+01:00"}}}`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := spiffefed.Decode([]byte(data))
			require.ErrorIs(t, err, spiffefed.ErrInvalidState)
		})
	}
	back, err := spiffefed.Decode(good)
	require.NoError(t, err)
	assert.Equal(t, seq, back.Bundles["a.example"].Sequence)
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// A bundle's publish time is when its roots were first stored: it moves
// with the roots, never with a step that keeps them, survives the stored
// form, and a state stored before it was recorded gets "now" (never a time
// before a peer could have fetched the roots; rounded up to the second).
// RootPublished, what a rotation waits on, is the latest over the trust
// domains asked for, and an error naming each one that lacks the root, is
// not published, or has no time — and for a snapshot not loaded from a
// state.
func TestAPublishTimeMovesWithTheRootsAndARotationWaitsOnTheLatest(t *testing.T) {
	oldRoot, newRoot, other := makeRoot(t, "old"), makeRoot(t, "new"), makeRoot(t, "other")
	roundTrip := func(st spiffefed.State) spiffefed.State {
		t.Helper()
		data, err := spiffefed.Encode(st)
		require.NoError(t, err)
		back, err := spiffefed.Decode(data)
		require.NoError(t, err)
		return back
	}
	ms := append(members("ns/vm", certs(oldRoot), "a.example", "b.example"), members("ns/other", certs(other), "c.example")...)
	st, _ := spiffefed.Next(spiffefed.State{}, ms, t0.Add(-500*time.Millisecond))
	st = roundTrip(st)
	for _, td := range []string{"a.example", "b.example", "c.example"} {
		assert.True(t, st.Bundles[td].Published.Equal(t0), "%s: stored in whole seconds, rounded up", td)
	}
	// A reconcile with the same roots keeps the time.
	st, rep := spiffefed.Next(st, ms, t0.Add(time.Minute))
	assert.True(t, rep.Empty())
	assert.True(t, st.Bundles["a.example"].Published.Equal(t0))

	// AddingNewRoot reaches a.example first, b.example a minute later.
	snap := func(st spiffefed.State) *spiffefed.Snapshot {
		s, err := spiffefed.NewSnapshot(st, time.Minute)
		require.NoError(t, err)
		return s
	}
	vmTDs := []string{"a.example", "b.example"}
	_, err := snap(st).RootPublished(vmTDs, newRoot.cert)
	assert.ErrorContains(t, err, "2 of 2 trust domains lack it: a.example (not yet), b.example (not yet)")
	half := append(members("ns/vm", certs(oldRoot, newRoot), "a.example"), members("ns/vm", certs(oldRoot), "b.example")...)
	st, _ = spiffefed.Next(st, append(half, members("ns/other", certs(other), "c.example")...), t0.Add(time.Hour))
	_, err = snap(roundTrip(st)).RootPublished(vmTDs, newRoot.cert)
	assert.ErrorContains(t, err, "1 of 2 trust domains lack it: b.example (not yet)")
	both := members("ns/vm", certs(oldRoot, newRoot), "a.example", "b.example")
	st, _ = spiffefed.Next(st, append(both, members("ns/other", certs(other), "c.example")...), t0.Add(time.Hour+time.Minute))
	since, err := snap(roundTrip(st)).RootPublished(vmTDs, newRoot.cert)
	require.NoError(t, err)
	assert.True(t, since.Equal(t0.Add(time.Hour+time.Minute)), "the latest trust domain's time: %v", since)
	since, err = snap(st).RootPublished(vmTDs, oldRoot.cert)
	require.NoError(t, err)
	assert.True(t, since.Equal(t0.Add(time.Hour+time.Minute)), "the old root too is in bundles published since then")
	assert.True(t, st.Bundles["c.example"].Published.Equal(t0), "another VirtualMesh's trust domain keeps its time")
	_, err = snap(st).RootPublished([]string{"c.example"}, newRoot.cert)
	assert.ErrorContains(t, err, "c.example (not yet)", "another VirtualMesh's bundle does not carry the root")
	_, err = snap(st).RootPublished([]string{"a.example", "gone.example"}, newRoot.cert)
	assert.ErrorContains(t, err, "gone.example (not published", "a trust domain refused or removed: peers may hold what they fetched before")
	_, err = (&spiffefed.Snapshot{}).RootPublished(vmTDs, newRoot.cert)
	assert.ErrorContains(t, err, "not loaded", "the placeholder served before the stored state is loaded")
	_, err = (*spiffefed.Snapshot)(nil).RootPublished(vmTDs, newRoot.cert)
	assert.Error(t, err)

	// A state stored before publish times were recorded: they are set to
	// now, the sequence stays, and the change is stored.
	data, err := spiffefed.Encode(st)
	require.NoError(t, err)
	var raw map[string]any
	require.NoError(t, json.Unmarshal(data, &raw))
	for _, e := range raw["bundles"].(map[string]any) {
		delete(e.(map[string]any), "published")
	}
	data, err = json.Marshal(raw)
	require.NoError(t, err)
	old, err := spiffefed.Decode(data)
	require.NoError(t, err)
	_, err = snap(old).RootPublished(vmTDs, newRoot.cert)
	assert.ErrorContains(t, err, "(no publish time yet)", "not known to be published long enough")
	later := t0.Add(2 * time.Hour)
	next, rep := spiffefed.Next(old, append(both, members("ns/other", certs(other), "c.example")...), later)
	assert.False(t, rep.Empty(), "stamped bundles are stored")
	assert.Equal(t, []string{"a.example", "b.example", "c.example"}, rep.Stamped)
	assert.Empty(t, rep.Changed)
	for td, e := range next.Bundles {
		assert.True(t, e.Published.Equal(later), td)
		assert.Equal(t, st.Bundles[td].Sequence, e.Sequence, "%s: the sequence stays", td)
	}
}
