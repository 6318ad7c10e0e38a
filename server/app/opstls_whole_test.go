package app_test

import (
	"context"
	"crypto/x509"
	"net/http"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/internal/opsclient"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// assertOpsServeTLS checks the process's metrics port serves /metrics and
// /healthz over TLS with a certificate that chains to roots, for its
// loopback address, and does not answer plain HTTP.
func assertOpsServeTLS(t *testing.T, addr string, roots *x509.CertPool) {
	t.Helper()
	c := &opsclient.Client{Address: addr, RootCAs: func(context.Context) (*x509.CertPool, error) { return roots, nil }}
	body, err := c.Get(context.Background(), "/metrics")
	require.NoError(t, err, "the metrics port at %s serves a certificate from the relay CA", addr)
	m, err := opsclient.ParseMetrics(body)
	require.NoError(t, err)
	assert.NotEmpty(t, m)
	_, err = c.Get(context.Background(), "/healthz")
	require.NoError(t, err)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + addr + "/healthz")
	if err == nil {
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "plain HTTP gets no answer but TLS's")
	}
}
