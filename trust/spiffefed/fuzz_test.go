package spiffefed_test

import (
	"strings"
	"testing"

	"github.com/relaymesh/relaymesh/trust/spiffefed"
)

// FuzzParsePath: whatever the path, ParsePath returns a trust domain only
// for exactly PathPrefix + a valid name, and that name round-trips.
func FuzzParsePath(f *testing.F) {
	for _, s := range []string{"/bundles/a.example", "/bundles/", "/", "/bundles/A", "/bundles/a/b", "/bundles/spiffe://a", strings.Repeat("/", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, path string) {
		td, err := spiffefed.ParsePath(path)
		if err != nil {
			if td != "" {
				t.Fatalf("an error and a trust domain %q", td)
			}
			return
		}
		if path != spiffefed.PathPrefix+td {
			t.Fatalf("%q parsed to %q", path, td)
		}
		if _, err := spiffefed.ParseTrustDomain(td); err != nil {
			t.Fatalf("%q parsed to an invalid trust domain %q: %v", path, td, err)
		}
	})
}

// FuzzDecode: a stored state is decoded or refused, never a panic, and
// what decodes encodes and decodes to the same.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"version":1,"counter":5,"bundles":{}}`))
	f.Add([]byte(`{"version":1,"counter":5,"bundles":{"a.example":{"sequence":1,"roots":"-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n"}}}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := spiffefed.Decode(data)
		if err != nil {
			return
		}
		out, err := spiffefed.Encode(st)
		if err != nil {
			t.Fatalf("a decoded state does not encode: %v", err)
		}
		back, err := spiffefed.Decode(out)
		if err != nil {
			t.Fatalf("an encoded state does not decode: %v", err)
		}
		if back.Counter != st.Counter || len(back.Bundles) != len(st.Bundles) {
			t.Fatalf("round trip changed the state")
		}
		for td, e := range st.Bundles {
			if back.Bundles[td].Sequence != e.Sequence || back.Bundles[td].Digest() != e.Digest() {
				t.Fatalf("round trip changed %s", td)
			}
		}
	})
}
