// Package spire runs a real SPIRE server (the pinned spire-server that
// `make tools` builds, SPIFFE's reference implementation) as a local
// process, to prove SPIFFE federation with Relaymesh against the
// implementation peers actually run: a spire-server that federates with
// Relaymesh's bundle endpoint shows, through its own CLI, which roots it
// holds for each of Relaymesh's trust domains.
//
// The server runs with a SQLite datastore, an in-memory key manager and
// the join_token node attestor, in a directory of its own; its API socket
// is the CLI's only way in. For the https_web profile, a federation
// relationship authenticates the endpoint with the process's system roots:
// Start gives it exactly WebRoots (SSL_CERT_FILE) and nothing else.
package spire

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// readyTimeout bounds the wait for the server's health check.
const readyTimeout = 60 * time.Second

// Federation is one federates_with relationship.
type Federation struct {
	// TrustDomain is the foreign trust domain (a bare name).
	TrustDomain string
	// URL is its bundle endpoint.
	URL string
	// EndpointSPIFFEID selects the https_spiffe profile (the endpoint
	// serves an X509-SVID with this ID); empty: https_web.
	EndpointSPIFFEID string
}

// Config says which spire-server to start.
type Config struct {
	// Bin is the spire-server binary; default: .cache/bin/spire-server of
	// the repository that contains the working directory.
	Bin string
	// TrustDomain is the server's own. Required.
	TrustDomain string
	// FederatesWith are its federation relationships.
	FederatesWith []Federation
	// WebRoots is a PEM file of the roots https_web relationships trust
	// (the process's SSL_CERT_FILE); empty: none.
	WebRoots string
	// BundleEndpoint serves the server's own bundle (https_spiffe, with
	// the X509-SVID EndpointID), refreshed every 10 seconds.
	BundleEndpoint bool
}

// Server is a running spire-server.
type Server struct {
	cfg    Config
	proc   *localcluster.Process
	dir    string
	socket string
	log    string
	// bundleAddr is the bundle endpoint's host:port, if served.
	bundleAddr string
}

// Start runs spire-server with cfg until it is healthy. Stop it.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Bin == "" {
		root, err := localcluster.RepoRoot()
		if err != nil {
			return nil, err
		}
		cfg.Bin = filepath.Join(root, ".cache", "bin", "spire-server")
	}
	if _, err := os.Stat(cfg.Bin); err != nil {
		return nil, fmt.Errorf("spire-server not found: run `make tools` first: %w", err)
	}
	if _, err := spiffeid.TrustDomainFromString(cfg.TrustDomain); err != nil {
		return nil, fmt.Errorf("spire: trust domain %q: %w", cfg.TrustDomain, err)
	}
	envBin, err := exec.LookPath("env")
	if err != nil {
		return nil, err
	}
	// A short directory: the API socket's path must fit a sockaddr_un.
	dir, err := os.MkdirTemp("", "spire-")
	if err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			_ = os.RemoveAll(dir)
		}
	}()
	addr, err := localcluster.ListenAddr()
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, dir: dir, socket: filepath.Join(dir, "api.sock"), log: filepath.Join(dir, "spire-server.log")}
	if cfg.BundleEndpoint {
		if s.bundleAddr, err = localcluster.ListenAddr(); err != nil {
			return nil, err
		}
	}
	conf := filepath.Join(dir, "server.conf")
	if err := os.WriteFile(conf, []byte(s.config(addr)), 0o600); err != nil {
		return nil, err
	}
	webRoots := cfg.WebRoots
	if webRoots == "" {
		webRoots = filepath.Join(dir, "no-roots.pem")
		if err := os.WriteFile(webRoots, nil, 0o600); err != nil {
			return nil, err
		}
	}
	args := []string{"-i", "-C", dir, "SSL_CERT_FILE=" + webRoots, "SSL_CERT_DIR=" + dir, cfg.Bin, "run", "-config", conf}
	s.proc, err = localcluster.StartProcess("spire-server "+cfg.TrustDomain, envBin, args, s.log, false)
	if err != nil {
		return nil, err
	}
	started = true // Stop removes the directory from here on
	wctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for {
		if _, err = s.cli(wctx, "healthcheck"); err == nil {
			return s, nil
		}
		if done, exitErr := s.proc.Exited(); done {
			err = fmt.Errorf("spire-server exited: %v", exitErr)
			break
		}
		select {
		case <-wctx.Done():
		case <-time.After(200 * time.Millisecond):
			continue
		}
		break
	}
	_ = s.Stop()
	return nil, fmt.Errorf("spire-server not healthy: %w\n--- last lines of its log ---\n%s", err, s.LogTail(30))
}

// config is the server's HCL configuration, listening on addr.
func (s *Server) config(addr string) string {
	host, port, _ := net.SplitHostPort(addr)
	var fed strings.Builder
	for _, f := range s.cfg.FederatesWith {
		profile := `bundle_endpoint_profile "https_web" {}`
		if f.EndpointSPIFFEID != "" {
			profile = fmt.Sprintf("bundle_endpoint_profile \"https_spiffe\" {\n        endpoint_spiffe_id = %q\n      }", f.EndpointSPIFFEID)
		}
		fmt.Fprintf(&fed, "    federates_with %q {\n      bundle_endpoint_url = %q\n      %s\n    }\n", f.TrustDomain, f.URL, profile)
	}
	if s.bundleAddr != "" {
		bhost, bport, _ := net.SplitHostPort(s.bundleAddr)
		fmt.Fprintf(&fed, "    bundle_endpoint {\n      address = %q\n      port = %s\n      refresh_hint = \"10s\"\n      profile \"https_spiffe\" {}\n    }\n", bhost, bport)
	}
	return fmt.Sprintf(`server {
  bind_address = %q
  bind_port = %q
  socket_path = %q
  trust_domain = %q
  data_dir = %q
  log_level = "DEBUG"
  ca_key_type = "ec-p256"
  ca_ttl = "24h"
  default_x509_svid_ttl = "1h"
  federation {
%s  }
}

plugins {
  DataStore "sql" {
    plugin_data {
      database_type = "sqlite3"
      connection_string = %q
    }
  }
  KeyManager "memory" {
    plugin_data {}
  }
  NodeAttestor "join_token" {
    plugin_data {}
  }
}
`, host, port, s.socket, s.cfg.TrustDomain, filepath.Join(s.dir, "data"), fed.String(), filepath.Join(s.dir, "data", "datastore.sqlite3"))
}

// cli runs `spire-server <args> -socketPath <socket>` and returns its
// standard output; an error carries its standard error.
func (s *Server) cli(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, s.cfg.Bin, append(args, "-socketPath", s.socket)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("spire-server %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// FederatedBundle is what `spire-server bundle list -id spiffe://<td>
// -format spiffe` shows of the bundle it holds for trust domain td.
func (s *Server) FederatedBundle(ctx context.Context, td string) (*spiffebundle.Bundle, error) {
	id, err := spiffeid.TrustDomainFromString(td)
	if err != nil {
		return nil, err
	}
	out, err := s.cli(ctx, "bundle", "list", "-id", id.IDString(), "-format", "spiffe")
	if err != nil {
		return nil, err
	}
	b, err := spiffebundle.Parse(id, out)
	if err != nil {
		return nil, fmt.Errorf("spire-server bundle list -id %s: %w: %q", id.IDString(), err, out)
	}
	return b, nil
}

// Federate creates a federation relationship at run time (`spire-server
// federation create`), with bootstrap as the bundle it holds for the
// trust domain first (PEM roots; required for https_spiffe: SPIRE
// authenticates the endpoint with the bundle it holds for the endpoint
// ID's trust domain). Its first fetch runs at once, and the next ones by
// the fetched bundle's refresh hint — unlike a relationship of the
// configuration file whose first fetch failed for want of a bundle, which
// SPIRE tries again only a minute later.
func (s *Server) Federate(ctx context.Context, f Federation, bootstrap []byte) error {
	id, err := spiffeid.TrustDomainFromString(f.TrustDomain)
	if err != nil {
		return err
	}
	args := []string{"federation", "create", "-trustDomain", id.Name(), "-bundleEndpointURL", f.URL}
	if f.EndpointSPIFFEID != "" {
		args = append(args, "-bundleEndpointProfile", "https_spiffe", "-endpointSpiffeID", f.EndpointSPIFFEID)
	} else {
		args = append(args, "-bundleEndpointProfile", "https_web")
	}
	if len(bootstrap) > 0 {
		path := filepath.Join(s.dir, "bundle-"+id.Name()+".pem")
		if err := os.WriteFile(path, bootstrap, 0o600); err != nil {
			return err
		}
		args = append(args, "-trustDomainBundlePath", path, "-trustDomainBundleFormat", "pem")
	}
	if _, err := s.cli(ctx, args...); err != nil {
		return err
	}
	// Loads the relationship now (its updater's first fetch runs at once).
	return s.Refresh(ctx, id.Name())
}

// Refresh asks the server to fetch trust domain td's bundle now
// (`spire-server federation refresh`) instead of at its next refresh.
func (s *Server) Refresh(ctx context.Context, td string) error {
	_, err := s.cli(ctx, "federation", "refresh", "-id", td)
	return err
}

// BundleEndpointURL is the URL of the server's own bundle endpoint
// (Config.BundleEndpoint).
func (s *Server) BundleEndpointURL() string { return "https://" + s.bundleAddr }

// EndpointID is the SPIFFE ID of the X509-SVID the bundle endpoint
// serves (SPIRE's own: spiffe://<trust domain>/spire/server).
func (s *Server) EndpointID() string { return "spiffe://" + s.cfg.TrustDomain + "/spire/server" }

// BundlePEM is the server's own bundle, PEM (`spire-server bundle show
// -format pem`): what a peer is bootstrapped with.
func (s *Server) BundlePEM(ctx context.Context) ([]byte, error) {
	return s.cli(ctx, "bundle", "show", "-format", "pem")
}

// Mint is an X509-SVID for id that the server signs (`spire-server x509
// mint`): its chain, leaf first.
func (s *Server) Mint(ctx context.Context, id string) ([]*x509.Certificate, error) {
	out, err := os.MkdirTemp(s.dir, "mint-")
	if err != nil {
		return nil, err
	}
	if _, err := s.cli(ctx, "x509", "mint", "-spiffeID", id, "-ttl", "1h", "-write", out); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(out, "svid.pem"))
	if err != nil {
		return nil, err
	}
	var chain []*x509.Certificate
	for block, rest := pem.Decode(b); block != nil; block, rest = pem.Decode(rest) {
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		chain = append(chain, c)
	}
	if len(chain) == 0 {
		return nil, fmt.Errorf("spire-server x509 mint wrote no certificate")
	}
	return chain, nil
}

// MintPEM is Mint for a workload that needs its key too: the X509-SVID
// chain and its private key (PKCS#8), PEM, as `spire-server x509 mint
// -write` stores them.
func (s *Server) MintPEM(ctx context.Context, id string) (chain, key []byte, err error) {
	out, err := os.MkdirTemp(s.dir, "mint-")
	if err != nil {
		return nil, nil, err
	}
	if _, err := s.cli(ctx, "x509", "mint", "-spiffeID", id, "-ttl", "1h", "-write", out); err != nil {
		return nil, nil, err
	}
	if chain, err = os.ReadFile(filepath.Join(out, "svid.pem")); err != nil {
		return nil, nil, err
	}
	if key, err = os.ReadFile(filepath.Join(out, "key.pem")); err != nil {
		return nil, nil, err
	}
	return chain, key, nil
}

// LogTail is the last n lines of the server's log.
func (s *Server) LogTail(n int) string {
	b, err := os.ReadFile(s.log)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Stop ends the server and removes its directory.
func (s *Server) Stop() error {
	var err error
	if s.proc != nil {
		err = s.proc.Stop(5 * time.Second)
	}
	return errors.Join(err, os.RemoveAll(s.dir))
}
