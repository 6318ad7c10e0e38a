package ca

import (
	"crypto/sha256"
	"crypto/x509"
	"fmt"
	"slices"
	"sync"
	"time"
)

// chainCache remembers signing chains that verified to their roots for a
// set of extended key usages, and over which time they keep verifying: the
// window in which every certificate of the chain and its roots is valid.
// Issuing a leaf then costs no chain building: x509.Verify checks chain
// signatures, validity, path lengths and key usage nesting, all properties
// of the chain alone, and name and policy constraints, which also depend on
// the leaf — a chain with any of those is never cached, so its leaves are
// verified in full.
type chainCache struct {
	mu sync.Mutex
	ok map[[sha256.Size]byte]window
}

// window is when a cached chain verifies.
type window struct{ from, until time.Time }

// maxCachedChains bounds the cache; a signer has one chain at a time, a
// rotation adds one.
const maxCachedChains = 16

// verifies reports whether chain verifies to roots for ekus at now,
// verifying it (with chain[0] as the certificate verified) the first time.
// It reports false for a chain that constrains names or policies, which the
// caller must then verify with the leaf.
func (c *chainCache) verifies(chain, roots []*x509.Certificate, ekus []x509.ExtKeyUsage, now time.Time) bool {
	all := slices.Concat(chain, roots)
	if len(chain) == 0 || len(roots) == 0 || slices.Contains(all, nil) || slices.ContainsFunc(all, constrainsLeaves) {
		return false
	}
	h := sha256.New()
	for _, part := range [][]*x509.Certificate{chain, roots} {
		fmt.Fprintf(h, "%d\x00", len(part))
		for _, cert := range part {
			sum := sha256.Sum256(cert.Raw)
			h.Write(sum[:])
		}
	}
	fmt.Fprintf(h, "%v", ekus)
	var key [sha256.Size]byte
	h.Sum(key[:0])

	c.mu.Lock()
	w, cached := c.ok[key]
	c.mu.Unlock()
	if cached {
		return !now.Before(w.from) && !now.After(w.until)
	}
	w = window{from: all[0].NotBefore, until: all[0].NotAfter}
	for _, cert := range all[1:] {
		if cert.NotBefore.After(w.from) {
			w.from = cert.NotBefore
		}
		if cert.NotAfter.Before(w.until) {
			w.until = cert.NotAfter
		}
	}
	if now.Before(w.from) || now.After(w.until) {
		return false
	}
	if checkIssuer(chain[0]) != nil {
		return false
	}
	paths, err := chain[0].Verify(x509.VerifyOptions{Roots: certPool(roots), Intermediates: certPool(chain[1:]), CurrentTime: now, KeyUsages: ekus})
	if err != nil || !slices.ContainsFunc(paths, allowsOneMore) {
		return false
	}
	c.mu.Lock()
	if c.ok == nil || len(c.ok) >= maxCachedChains {
		c.ok = map[[sha256.Size]byte]window{}
	}
	c.ok[key] = w
	c.mu.Unlock()
	return true
}

// allowsOneMore reports whether the path p, which verified with p[0] as
// its end entity, still satisfies every path length constraint once p[0]
// is an intermediate above a leaf: x509.Verify did not count p[0] among the
// CA certificates following p[j], and the leaf's own verification would.
func allowsOneMore(p []*x509.Certificate) bool {
	for j := 1; j < len(p); j++ {
		if pathLenAllows(p[j], j, false) != nil {
			return false
		}
	}
	return true
}

// constrainsLeaves reports whether cert constrains the names or policies of
// certificates below it (which x509.Verify checks against each leaf), or
// has a critical extension x509 does not handle.
func constrainsLeaves(cert *x509.Certificate) bool {
	return len(cert.PermittedDNSDomains)+len(cert.ExcludedDNSDomains)+len(cert.PermittedIPRanges)+len(cert.ExcludedIPRanges)+
		len(cert.PermittedEmailAddresses)+len(cert.ExcludedEmailAddresses)+len(cert.PermittedURIDomains)+len(cert.ExcludedURIDomains) > 0 ||
		cert.PermittedDNSDomainsCritical ||
		cert.RequireExplicitPolicy > 0 || cert.RequireExplicitPolicyZero ||
		cert.InhibitPolicyMapping > 0 || cert.InhibitPolicyMappingZero ||
		cert.InhibitAnyPolicy > 0 || cert.InhibitAnyPolicyZero ||
		len(cert.PolicyMappings) > 0 ||
		len(cert.UnhandledCriticalExtensions) > 0
}
