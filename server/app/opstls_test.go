package app

import (
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The metrics port's transport: TLS by default; provided files go in
// pairs; plain HTTP is an opt-in for a loopback address only, and not
// beside provided files.
func TestMetricsPlainHTTPOnlyOnLoopback(t *testing.T) {
	ok := Default()
	ok.AuditLog = "audit.log"
	require.NoError(t, ok.Validate())
	assert.False(t, ok.MetricsTLS.PlainHTTP, "TLS is the default")
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string // "" : valid
	}{
		{"plain HTTP on every interface", func(c *Config) { c.MetricsTLS.PlainHTTP = true }, "--metrics-plain-http is allowed only on a loopback --metrics-listen"},
		{"plain HTTP on a routable address", func(c *Config) { c.MetricsListen, c.MetricsTLS.PlainHTTP = "10.0.0.1:9091", true }, "not \"10.0.0.1:9091\""},
		{"plain HTTP on a name", func(c *Config) { c.MetricsListen, c.MetricsTLS.PlainHTTP = "relaymesh-server:9091", true }, "loopback"},
		{"plain HTTP on an unparsable address", func(c *Config) { c.MetricsListen, c.MetricsTLS.PlainHTTP = "127.0.0.1", true }, "loopback"},
		{"plain HTTP on 127.0.0.1", func(c *Config) { c.MetricsListen, c.MetricsTLS.PlainHTTP = "127.0.0.1:9091", true }, ""},
		{"plain HTTP on a private loopback address", func(c *Config) { c.MetricsListen, c.MetricsTLS.PlainHTTP = "127.4.5.6:0", true }, ""},
		{"plain HTTP on [::1]", func(c *Config) { c.MetricsListen, c.MetricsTLS.PlainHTTP = "[::1]:9091", true }, ""},
		{"plain HTTP and files", func(c *Config) {
			c.MetricsListen, c.MetricsTLS = "127.0.0.1:9091", MetricsTLSConfig{PlainHTTP: true, CertFile: "c", KeyFile: "k"}
		}, "--metrics-plain-http and --metrics-tls-cert are alternatives"},
		{"a certificate without its key", func(c *Config) { c.MetricsTLS.CertFile = "c.pem" }, "--metrics-tls-cert and --metrics-tls-key go together"},
		{"a key without its certificate", func(c *Config) { c.MetricsTLS.KeyFile = "k.pem" }, "--metrics-tls-cert and --metrics-tls-key go together"},
		{"a bad IP", func(c *Config) { c.MetricsTLS.IPs = []string{"10.0.0.300"} }, "--metrics-ips"},
		{"files", func(c *Config) { c.MetricsTLS.CertFile, c.MetricsTLS.KeyFile = "c.pem", "k.pem" }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.edit(&c)
			err := c.Validate()
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// The relay-CA certificate of the metrics port names the server and
// loopback (a port-forward's address) by default, each once, or exactly
// the names given.
func TestMetricsCertificateNamesTheServerAndLoopback(t *testing.T) {
	c := Default()
	names, ips, err := c.metricsNames()
	require.NoError(t, err)
	assert.Equal(t, []string{"localhost", "relaymesh-server", "relaymesh-server.relaymesh.svc"}, names)
	assert.Equal(t, "[127.0.0.1 ::1]", fmtIPs(ips))
	c.MetricsTLS.DNSNames, c.MetricsTLS.IPs = []string{"metrics.example.com"}, []string{"10.1.2.3"}
	names, ips, err = c.metricsNames()
	require.NoError(t, err)
	assert.Equal(t, []string{"metrics.example.com"}, names)
	assert.Equal(t, "[10.1.2.3]", fmtIPs(ips))
}

func fmtIPs(ips []net.IP) string {
	s := "["
	for i, ip := range ips {
		if i > 0 {
			s += " "
		}
		s += ip.String()
	}
	return s + "]"
}
