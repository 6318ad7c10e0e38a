package spiffefed

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Bounds of the stored State (it lives in one ConfigMap, at most 1 MiB).
const (
	// MaxTrustDomains is how many trust domains are published at most.
	MaxTrustDomains = 256
	// MaxRoots is how many root certificates one bundle carries at most.
	MaxRoots = 8
	// MaxStateBytes bounds the encoded State.
	MaxStateBytes = 900 << 10
	// maxTrustDomainLen is the longest trust domain name (SPIFFE ID spec:
	// a DNS name, at most 255 bytes).
	maxTrustDomainLen = 255
	stateVersion      = 1
)

// ErrInvalidState: a stored State that cannot be trusted; nothing of it is
// used.
var ErrInvalidState = errors.New("spiffefed: invalid stored bundle state")

// Entry is the published bundle of one trust domain.
type Entry struct {
	// VirtualMesh (namespace/name) whose root the trust domain's
	// identities chain to. Stored, never served.
	VirtualMesh string
	// Sequence is the bundle's spiffe_sequence.
	Sequence uint64
	// Roots are the X.509 authorities, in a stable order (by DER).
	Roots []*x509.Certificate
	// Published is when these roots were first stored for the trust
	// domain (the Lease holder's clock, whole seconds): a rotation waits
	// from then for federated peers to fetch a new root
	// (docs/design/2026-12-03-federation-wait.md). Zero only in a state
	// stored before it was recorded; Next records it then.
	Published time.Time
}

// Holds reports whether root is one of e's roots.
func (e Entry) Holds(root *x509.Certificate) bool {
	return slices.ContainsFunc(e.Roots, root.Equal)
}

// Digest identifies the roots of e: their DER, sorted.
func (e Entry) Digest() string { return digest(e.Roots) }

// State is what is published, as stored.
type State struct {
	// Counter is the highest sequence ever given.
	Counter uint64
	// Bundles by trust domain name.
	Bundles map[string]Entry
}

// Member is one mesh's trust request, as the trust controller published it.
type Member struct {
	// VirtualMesh is namespace/name.
	VirtualMesh string
	// TrustDomain is the mesh's; empty on a held request of an Invalid
	// VirtualMesh (then every trust domain published for VirtualMesh
	// stays as it is).
	TrustDomain string
	// Roots are the mesh's root-cert.pem; none: held (what is published
	// for the trust domain stays as it is).
	Roots []*x509.Certificate
}

// Refusal is a trust domain Next does not publish, and why.
type Refusal struct {
	TrustDomain string
	Reason      string
}

// Report is what Next changed.
type Report struct {
	// Changed are trust domains with a new sequence; Removed those no
	// longer published; Stamped those whose unchanged bundle got the
	// publish time a state stored before it was recorded lacked. Sorted.
	Changed, Removed, Stamped []string
	Refused                   []Refusal
}

// Empty reports whether Next changed nothing that must be stored.
func (r Report) Empty() bool {
	return len(r.Changed) == 0 && len(r.Removed) == 0 && len(r.Stamped) == 0
}

// Next is the State to publish for members, from prev: a trust domain
// whose roots changed gets a new sequence; one whose meshes are all held
// keeps its bundle; one no mesh names any more is removed. A trust domain
// named by meshes of two VirtualMeshes with different roots, or by invalid
// names, is refused and not published (never merged): a bundle that
// mixed them would let one VirtualMesh's root vouch for the other's
// identities.
func Next(prev State, members []Member, now time.Time) (State, Report) {
	type want struct {
		vms     map[string]bool
		digests map[string][]*x509.Certificate
		invalid string
	}
	wants := map[string]*want{}
	heldVMs := map[string]bool{}
	for _, m := range members {
		if m.TrustDomain == "" {
			if len(m.Roots) == 0 {
				heldVMs[m.VirtualMesh] = true
			}
			continue
		}
		w := wants[m.TrustDomain]
		if w == nil {
			w = &want{vms: map[string]bool{}, digests: map[string][]*x509.Certificate{}}
			wants[m.TrustDomain] = w
		}
		w.vms[m.VirtualMesh] = true
		if _, err := ParseTrustDomain(m.TrustDomain); err != nil {
			w.invalid = err.Error()
			continue
		}
		if len(m.Roots) > MaxRoots {
			w.invalid = fmt.Sprintf("%d roots, more than %d", len(m.Roots), MaxRoots)
			continue
		}
		if len(m.Roots) > 0 {
			roots := SortedRoots(m.Roots)
			w.digests[digest(roots)] = roots
		}
	}
	next := State{Counter: prev.Counter, Bundles: map[string]Entry{}}
	var rep Report
	// Whole seconds, rounded up: never before now.
	stamp := now.UTC().Truncate(time.Second)
	if stamp.Before(now) {
		stamp = stamp.Add(time.Second)
	}
	for _, td := range slices.Sorted(maps.Keys(wants)) {
		w := wants[td]
		old, had := prev.Bundles[td]
		switch {
		case w.invalid != "":
			rep.Refused = append(rep.Refused, Refusal{TrustDomain: text.Truncate(td, 80), Reason: "invalid: " + w.invalid})
			continue
		case len(w.vms) > 1 && len(w.digests) != 1:
			rep.Refused = append(rep.Refused, Refusal{TrustDomain: td, Reason: fmt.Sprintf(
				"named by meshes of VirtualMeshes %s with different roots: not published (bundles of different roots are never merged)", strings.Join(slices.Sorted(maps.Keys(w.vms)), ", "))})
			continue
		case len(w.digests) > 1:
			rep.Refused = append(rep.Refused, Refusal{TrustDomain: td, Reason: "its meshes were asked to hold different roots: not published"})
			continue
		case len(next.Bundles) >= MaxTrustDomains:
			rep.Refused = append(rep.Refused, Refusal{TrustDomain: td, Reason: fmt.Sprintf("more than %d trust domains: not published", MaxTrustDomains)})
			continue
		}
		vm := slices.Sorted(maps.Keys(w.vms))[0]
		if len(w.digests) == 0 {
			// Held: what is published stays.
			if had {
				next.Bundles[td] = old
			}
			continue
		}
		var roots []*x509.Certificate
		for _, r := range w.digests {
			roots = r
		}
		if had && old.Digest() == digest(roots) {
			old.VirtualMesh = vm
			if old.Published.IsZero() {
				// Counted from now, never from before: a peer may have
				// fetched the roots no earlier than this.
				old.Published = stamp
				rep.Stamped = append(rep.Stamped, td)
			}
			next.Bundles[td] = old
			continue
		}
		next.Counter = max(next.Counter+1, uint64(max(now.Unix(), 0)))
		next.Bundles[td] = Entry{VirtualMesh: vm, Sequence: next.Counter, Roots: roots, Published: stamp}
		rep.Changed = append(rep.Changed, td)
	}
	for _, td := range slices.Sorted(maps.Keys(prev.Bundles)) {
		if _, ok := next.Bundles[td]; ok {
			continue
		}
		if old := prev.Bundles[td]; heldVMs[old.VirtualMesh] && wants[td] == nil && len(next.Bundles) < MaxTrustDomains {
			next.Bundles[td] = old // its VirtualMesh is Invalid for now: held
			continue
		}
		rep.Removed = append(rep.Removed, td)
	}
	return next, rep
}

// SortedRoots is roots without duplicates, sorted by DER: the one order
// bundles are compared, encoded and shown in.
func SortedRoots(roots []*x509.Certificate) []*x509.Certificate {
	out := slices.Clone(roots)
	slices.SortFunc(out, func(a, b *x509.Certificate) int { return bytes.Compare(a.Raw, b.Raw) })
	return slices.CompactFunc(out, func(a, b *x509.Certificate) bool { return a.Equal(b) })
}

// SameRoots reports whether a and b hold the same roots, whatever their
// order and duplicates.
func SameRoots(a, b []*x509.Certificate) bool { return digest(a) == digest(b) }

func digest(roots []*x509.Certificate) string {
	h := sha256.New()
	for _, r := range SortedRoots(roots) {
		sum := sha256.Sum256(r.Raw)
		h.Write(sum[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// stored is State's encoded form.
type stored struct {
	Version int                    `json:"version"`
	Counter uint64                 `json:"counter"`
	Bundles map[string]storedEntry `json:"bundles"`
}

type storedEntry struct {
	VirtualMesh string `json:"virtualMesh"`
	Sequence    uint64 `json:"sequence"`
	// Roots are PEM certificates.
	Roots string `json:"roots"`
	// Published is RFC 3339 (UTC, seconds); absent in a state stored
	// before it was recorded.
	Published string `json:"published,omitempty"`
}

// Encode is s's stored form (JSON).
func Encode(s State) ([]byte, error) {
	out := stored{Version: stateVersion, Counter: s.Counter, Bundles: map[string]storedEntry{}}
	for td, e := range s.Bundles {
		var b bytes.Buffer
		for _, r := range e.Roots {
			_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: r.Raw})
		}
		se := storedEntry{VirtualMesh: e.VirtualMesh, Sequence: e.Sequence, Roots: b.String()}
		if !e.Published.IsZero() {
			se.Published = e.Published.UTC().Format(time.RFC3339)
		}
		out.Bundles[td] = se
	}
	data, err := json.Marshal(out)
	if err != nil {
		return nil, err
	}
	if len(data) > MaxStateBytes {
		return nil, fmt.Errorf("spiffefed: the bundle state is %d bytes, more than %d", len(data), MaxStateBytes)
	}
	return data, nil
}

// Decode parses a stored State, refusing (ErrInvalidState) anything that
// Encode would not have made of a State Next made: oversized, an unknown
// version, an invalid trust domain, roots that are not CA certificates, a
// sequence above the counter, a publish time that is not RFC 3339 UTC.
func Decode(data []byte) (State, error) {
	bad := func(format string, args ...any) (State, error) {
		return State{}, fmt.Errorf("%w: "+format, append([]any{ErrInvalidState}, args...)...)
	}
	if len(data) > MaxStateBytes {
		return bad("%d bytes, more than %d", len(data), MaxStateBytes)
	}
	var in stored
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return bad("not JSON of the expected shape")
	}
	if dec.More() {
		return bad("trailing data")
	}
	if in.Version != stateVersion {
		return bad("version %d, want %d", in.Version, stateVersion)
	}
	if len(in.Bundles) > MaxTrustDomains {
		return bad("%d trust domains, more than %d", len(in.Bundles), MaxTrustDomains)
	}
	out := State{Counter: in.Counter, Bundles: map[string]Entry{}}
	for td, e := range in.Bundles {
		if _, err := ParseTrustDomain(td); err != nil {
			return bad("trust domain %q: %v", text.Truncate(td, 80), err)
		}
		if e.Sequence == 0 || e.Sequence > in.Counter {
			return bad("trust domain %s: sequence %d is not in [1, counter %d]", td, e.Sequence, in.Counter)
		}
		roots, err := parseRoots([]byte(e.Roots))
		if err != nil {
			return bad("trust domain %s: %v", td, err)
		}
		var published time.Time
		if e.Published != "" {
			if published, err = time.Parse(time.RFC3339, e.Published); err != nil || published.UTC().Format(time.RFC3339) != e.Published {
				return bad("trust domain %s: published is not an RFC 3339 time in UTC", td)
			}
		}
		out.Bundles[td] = Entry{VirtualMesh: e.VirtualMesh, Sequence: e.Sequence, Roots: roots, Published: published}
	}
	return out, nil
}

// parseRoots parses PEM CA certificates, 1 to MaxRoots of them, and
// nothing else.
func parseRoots(data []byte) ([]*x509.Certificate, error) {
	var roots []*x509.Certificate
	for {
		block, rest := pem.Decode(data)
		if block == nil {
			if len(bytes.TrimSpace(rest)) > 0 {
				return nil, errors.New("roots: data that is not PEM")
			}
			break
		}
		data = rest
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("roots: a PEM block of type %q", text.Truncate(block.Type, 40))
		}
		if len(roots) == MaxRoots {
			return nil, fmt.Errorf("roots: more than %d", MaxRoots)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, errors.New("roots: a certificate that does not parse")
		}
		if !c.IsCA || !c.BasicConstraintsValid {
			return nil, errors.New("roots: a certificate that is not a CA")
		}
		roots = append(roots, c)
	}
	if len(roots) == 0 {
		return nil, errors.New("roots: none")
	}
	return SortedRoots(roots), nil
}

// ParseRoots parses a root bundle (PEM CA certificates) as Member.Roots.
func ParseRoots(pemData []byte) ([]*x509.Certificate, error) { return parseRoots(pemData) }

// ParseMeshRoots parses a mesh's root bundle (a TrustRequest's, what
// root-cert.pem carries) as Member.Roots: its self-signed certificates
// only. The cross-certificates of foreign roots it may carry after them
// (spec.mtls.federatedTrustDomains) are the foreign trust domains', never
// published as the mesh's own.
func ParseMeshRoots(pemData []byte) ([]*x509.Certificate, error) {
	var own []byte
	for rest := pemData; ; {
		block, next := pem.Decode(rest)
		if block == nil {
			own = append(own, rest...) // parseRoots refuses what is not PEM
			break
		}
		rest = next
		if block.Type == "CERTIFICATE" {
			// Self-signed, not only self-issued: a cross-certificate of a
			// foreign root with the subject of ours is not ours.
			if c, err := x509.ParseCertificate(block.Bytes); err == nil && (!bytes.Equal(c.RawIssuer, c.RawSubject) || c.CheckSignatureFrom(c) != nil) {
				continue
			}
		}
		own = append(own, pem.EncodeToMemory(block)...)
	}
	return parseRoots(own)
}

// ParseTrustDomain parses a bare trust domain name (no spiffe:// form):
// 1 to 255 bytes of lowercase letters, digits, '.', '-' and '_'.
func ParseTrustDomain(name string) (spiffeid.TrustDomain, error) {
	if name == "" || len(name) > maxTrustDomainLen {
		return spiffeid.TrustDomain{}, fmt.Errorf("%w: a trust domain name has 1 to %d bytes", ErrBadTrustDomain, maxTrustDomainLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return spiffeid.TrustDomain{}, fmt.Errorf("%w: only lowercase letters, digits, '.', '-' and '_'", ErrBadTrustDomain)
		}
	}
	td, err := spiffeid.TrustDomainFromString(name)
	if err != nil || td.Name() != name {
		return spiffeid.TrustDomain{}, fmt.Errorf("%w: not a SPIFFE trust domain", ErrBadTrustDomain)
	}
	return td, nil
}

// ErrBadTrustDomain: not a trust domain name.
var ErrBadTrustDomain = errors.New("not a trust domain name")
