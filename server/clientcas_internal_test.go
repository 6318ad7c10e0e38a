package server

import (
	"context"
	"crypto/x509"
	"sync"
	"testing"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// rootsIssuer is an Issuer whose roots a test changes, as a reload does.
type rootsIssuer struct {
	mu    sync.Mutex
	roots []*x509.Certificate
}

func (r *rootsIssuer) IssueAgentFor(context.Context, *x509.CertificateRequest, spiffeid.ID, string) (*ca.Issued, error) {
	return nil, nil
}
func (r *rootsIssuer) Chain() []*x509.Certificate { return nil }
func (r *rootsIssuer) Roots() []*x509.Certificate {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.roots
}

func TestTheClientCAsFollowTheRelayRootsWithoutARestart(t *testing.T) {
	a, err := ca.GenerateRelayCA(ca.GenerateConfig{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := ca.GenerateRelayCA(ca.GenerateConfig{})
	if err != nil {
		t.Fatal(err)
	}
	iss := &rootsIssuer{roots: []*x509.Certificate{a.Root}}
	s := &Server{cfg: ServerConfig{Issuer: iss}}
	cfg := s.tlsConfig()
	trusts := func(c *x509.Certificate) bool {
		t.Helper()
		got, err := cfg.GetConfigForClient(nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Verify(x509.VerifyOptions{Roots: got.ClientCAs})
		return err == nil
	}
	if !trusts(a.Issuer) || trusts(b.Issuer) {
		t.Fatal("before: want only the first root trusted")
	}
	iss.mu.Lock()
	iss.roots = []*x509.Certificate{a.Root, b.Root}
	iss.mu.Unlock()
	if !trusts(a.Issuer) || !trusts(b.Issuer) {
		t.Fatal("during the overlap: want both roots trusted")
	}
	first, _ := cfg.GetConfigForClient(nil)
	again, _ := cfg.GetConfigForClient(nil)
	if first != again {
		t.Error("the same roots built a new configuration at every handshake")
	}
	iss.mu.Lock()
	iss.roots = []*x509.Certificate{b.Root}
	iss.mu.Unlock()
	if trusts(a.Issuer) || !trusts(b.Issuer) {
		t.Fatal("after: want only the new root trusted")
	}
}
