// Package remote holds what the back ends that sign through a CA service
// over HTTPS (ca/cfsslca, ca/stepca) share.
package remote

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"time"
)

// NewClient is the HTTP client of a remote CA: it trusts only roots for
// the server's certificate, takes no proxy from the environment, bounds
// every request by timeout, and never follows a redirect.
func NewClient(roots []*x509.Certificate, timeout time.Duration) *http.Client {
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			// No proxy from the environment: where CA requests go is
			// configuration, not ambient state.
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
			TLSHandshakeTimeout: 10 * time.Second,
			MaxIdleConnsPerHost: 16,
			IdleConnTimeout:     90 * time.Second,
			ForceAttemptHTTP2:   true,
		},
		// Never follow a redirect to somewhere else.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
