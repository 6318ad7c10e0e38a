package dashboard

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"
)

// The dashboard's transport. It is served over TLS: with a certificate the
// server's relay CA issues (like the relay port's), or one provided as PEM
// files (the chart mounts a Secret, e.g. one cert-manager keeps). Plain
// HTTP is a WEAKER opt-in the server allows on a loopback address only.

// maxPEMFile bounds a certificate or key file.
const maxPEMFile = 1 << 20

// fileCheckEvery is how often, at most, a handshake looks at the files
// again.
const fileCheckEvery = time.Second

// CertificateFiles serves the certificate and key of two PEM files and
// reloads them when either changes (a Secret volume's update, cert-manager's
// renewal); a changed pair that does not load is logged and the last good
// one kept. Safe for concurrent use.
type CertificateFiles struct {
	certPath, keyPath string
	clock             func() time.Time
	log               *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   [2]fileStamp
	checked time.Time
}

// fileStamp tells a file's versions apart.
type fileStamp struct {
	mod  time.Time
	size int64
}

// ErrCertificate is a provided certificate or key that cannot be served.
var ErrCertificate = errors.New("dashboard certificate")

// LoadCertificateFiles loads certPath (PEM: the certificate, then any
// intermediates) and keyPath (its PEM private key). It refuses a pair that
// does not match, a certificate not valid at now or not for serverAuth,
// and files over 1 MiB.
func LoadCertificateFiles(certPath, keyPath string, clock func() time.Time, log *slog.Logger) (*CertificateFiles, error) {
	if clock == nil {
		clock = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &CertificateFiles{certPath: certPath, keyPath: keyPath, clock: clock, log: log.With("component", "dashboard", "part", "certificate-files")}
	cert, stamp, err := c.load()
	if err != nil {
		return nil, err
	}
	c.cert, c.stamp, c.checked = cert, stamp, clock()
	return c, nil
}

// Certificate returns the current certificate, reloaded first if the files
// changed.
func (c *CertificateFiles) Certificate() (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock()
	if now.Sub(c.checked) < fileCheckEvery {
		return c.cert, nil
	}
	c.checked = now
	stamp, err := c.stamps()
	if err != nil || stamp == c.stamp {
		if err != nil {
			c.log.Warn("cannot look at the dashboard's certificate files; serving the last one loaded", "error", err)
		}
		return c.cert, nil
	}
	cert, stamp, err := c.load()
	if err != nil {
		// Half of a pair may be written before the other: try again at
		// the next look.
		c.log.Error("the dashboard's certificate files changed but do not load; serving the last one loaded", "error", err)
		return c.cert, nil
	}
	c.cert, c.stamp = cert, stamp
	c.log.Info("dashboard certificate reloaded", "subject", cert.Leaf.Subject.String(), "not_after", cert.Leaf.NotAfter)
	return c.cert, nil
}

func (c *CertificateFiles) stamps() ([2]fileStamp, error) {
	var out [2]fileStamp
	for i, p := range []string{c.certPath, c.keyPath} {
		fi, err := os.Stat(p)
		if err != nil {
			return out, err
		}
		out[i] = fileStamp{mod: fi.ModTime(), size: fi.Size()}
	}
	return out, nil
}

func (c *CertificateFiles) load() (*tls.Certificate, [2]fileStamp, error) {
	stamp, err := c.stamps()
	if err != nil {
		return nil, stamp, fmt.Errorf("%w: %w", ErrCertificate, err)
	}
	certPEM, err := readBounded(c.certPath)
	if err != nil {
		return nil, stamp, err
	}
	keyPEM, err := readBounded(c.keyPath)
	if err != nil {
		return nil, stamp, err
	}
	cert, err := ParseCertificate(certPEM, keyPEM, c.clock())
	return cert, stamp, err
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCertificate, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxPEMFile+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrCertificate, path, err)
	}
	if len(b) > maxPEMFile {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrCertificate, path, maxPEMFile)
	}
	return b, nil
}

// ParseCertificate checks a PEM certificate chain and key for serving at
// now: they match, the certificate is valid then, and its extended key
// usage, if any, allows serverAuth. Errors never quote the key.
func ParseCertificate(certPEM, keyPEM []byte, now time.Time) (*tls.Certificate, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		// crypto/tls's errors name what is wrong, never the key's bytes.
		return nil, fmt.Errorf("%w: %w", ErrCertificate, err)
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrCertificate, err)
		}
		pair.Leaf = leaf
	}
	switch {
	case now.Before(leaf.NotBefore):
		return nil, fmt.Errorf("%w: %q is not valid before %s", ErrCertificate, leaf.Subject.String(), leaf.NotBefore.UTC().Format(time.RFC3339))
	case !now.Before(leaf.NotAfter):
		return nil, fmt.Errorf("%w: %q expired at %s", ErrCertificate, leaf.Subject.String(), leaf.NotAfter.UTC().Format(time.RFC3339))
	case leaf.IsCA:
		return nil, fmt.Errorf("%w: %q is a CA certificate, not a serving certificate", ErrCertificate, leaf.Subject.String())
	case len(leaf.ExtKeyUsage) > 0 && !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth) && !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageAny):
		return nil, fmt.Errorf("%w: %q is not for serverAuth", ErrCertificate, leaf.Subject.String())
	}
	return &pair, nil
}

// ServerTLS is the dashboard's TLS configuration: TLS 1.2 or later, the
// certificate of get at each handshake, HTTP/2 or HTTP/1.1.
func ServerTLS(get func() (*tls.Certificate, error)) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return get() }}
}
