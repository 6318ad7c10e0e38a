package main

import (
	"github.com/relaymesh/relaymesh/server/app"
	"github.com/relaymesh/relaymesh/trust/spiffefed"
	"github.com/spf13/pflag"
)

// spiffeBundleFlags are the SPIFFE bundle endpoint's flags of `relaymesh
// server` (docs/spiffe-federation.md).
type spiffeBundleFlags struct {
	cfg           app.BundleEndpointConfig
	dnsNames, ips string
}

func (s *spiffeBundleFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&s.cfg.Listen, "spiffe-bundle-listen", "", "serve every VirtualMesh trust domain's SPIFFE bundle (SPIFFE Federation, profile https_web) on this address, e.g. :8443, at GET /bundles/<trust domain>; unauthenticated and public by design; empty: off")
	fs.StringVar(&s.cfg.CertFile, "spiffe-bundle-tls-cert", "", "PEM file of the bundle endpoint's serving certificate (then its intermediates), e.g. from a public CA, reloaded when it changes; default: a certificate from the relay CA for --spiffe-bundle-dns-names and --spiffe-bundle-ips (clients then trust the relay root, relay-root-tls-secret ca.crt)")
	fs.StringVar(&s.cfg.KeyFile, "spiffe-bundle-tls-key", "", "PEM file of the private key of --spiffe-bundle-tls-cert")
	fs.StringVar(&s.dnsNames, "spiffe-bundle-dns-names", "", "comma-separated DNS names of the bundle endpoint's relay-CA certificate (default: --server-dns-names)")
	fs.StringVar(&s.ips, "spiffe-bundle-ips", "", "comma-separated IPs of the bundle endpoint's relay-CA certificate (default: --server-ips)")
	fs.DurationVar(&s.cfg.RefreshHint, "spiffe-bundle-refresh-hint", spiffefed.DefaultRefreshHint, "spiffe_refresh_hint of every bundle served: how often federated peers should fetch it again, in [10s, 24h]")
	fs.StringVar(&s.cfg.SPIFFEListen, "spiffe-bundle-spiffe-listen", "", "also serve the bundles with the https_spiffe profile on this address, e.g. :8444: with an X509-SVID for --spiffe-bundle-endpoint-id issued from the root of its trust domain's VirtualMesh (24h, issued anew at 16h, and within 2s when a rotation moves the issuing root); needs --spiffe-bundle-listen; empty: off")
	fs.StringVar(&s.cfg.EndpointID, "spiffe-bundle-endpoint-id", "", "the SPIFFE ID the https_spiffe endpoint serves, e.g. spiffe://cluster-1.local/relaymesh/bundle-endpoint: peers name it as their endpoint SPIFFE ID; its trust domain must be one a VirtualMesh publishes, and only peers that trust that VirtualMesh's root can authenticate it")
	fs.DurationVar(&s.cfg.PeerPoll, "spiffe-bundle-peer-poll", app.DefaultPeerPoll, "the longest a federated peer takes to fetch a bundle again whatever its refresh hint (Istio's caCertificates spiffeBundleUrl: 30m), in [0s, 24h]; a root rotation keeps AddingNewRoot until the new root has been published for 3 refresh hints plus this, so every peer trusts it before anything is issued from it")
}

// config is the endpoint's Config from the flags.
func (s spiffeBundleFlags) config() app.BundleEndpointConfig {
	c := s.cfg
	c.DNSNames, c.IPs = splitList(s.dnsNames), splitList(s.ips)
	return c
}
