package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/relay"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// The dashboard flags are checked before anything starts: plain HTTP only
// on a loopback address, a certificate with its key, one audience.
func TestDashboardFlags(t *testing.T) {
	base := serverFlags{auditLog: "a.log", namespace: "relaymesh", logLevel: "info", trustDomain: "relaymesh.local", issuerTTL: 365 * 24 * time.Hour, issuerRenewAt: ca.DefaultIssuerRenewAt, issuerCheck: time.Minute, webhookFailurePolicy: "Fail", dnsNames: "localhost", debugEndpoints: "authenticated",
		conns: relay.ConnectionLimits{MaxConnections: 1, MaxConnectionsPerAddress: 1, MaxPreAuth: 1, MaxPreAuthPerAddress: 1, StreamsPerSecond: 50}, clusters: relay.ClusterLimits{RenewsPerMinute: 1, MaxSessions: 1}, kubeQPS: 200,
		dash: dashboardServeFlags{audience: "relaymesh-dashboard", idleTimeout: time.Minute, maxLifetime: time.Hour}}
	for _, tc := range []struct {
		name string
		edit func(*dashboardServeFlags)
		want string
	}{
		{"plain HTTP on every interface", func(f *dashboardServeFlags) { f.listen, f.plainHTTP = ":9092", true }, "--dashboard-plain-http is allowed only on a loopback --dashboard-listen"},
		{"plain HTTP on 0.0.0.0", func(f *dashboardServeFlags) { f.listen, f.plainHTTP = "0.0.0.0:9092", true }, "not \"0.0.0.0:9092\""},
		{"plain HTTP on a pod address", func(f *dashboardServeFlags) { f.listen, f.plainHTTP = "10.1.2.3:9092", true }, "needs TLS"},
		{"plain HTTP on a host name", func(f *dashboardServeFlags) { f.listen, f.plainHTTP = "dashboard.example:9092", true }, "loopback"},
		{"plain HTTP and a certificate", func(f *dashboardServeFlags) {
			f.listen, f.plainHTTP, f.certFile, f.keyFile = "127.0.0.1:9092", true, "c", "k"
		}, "alternatives"},
		{"a certificate without key", func(f *dashboardServeFlags) { f.listen, f.certFile = ":9092", "c" }, "go together"},
		{"TLS flags without listen", func(f *dashboardServeFlags) { f.certFile, f.keyFile = "c", "k" }, "need --dashboard-listen"},
		{"no audience", func(f *dashboardServeFlags) { f.listen, f.audience = ":9092", "" }, "--dashboard-audience"},
		{"two audiences", func(f *dashboardServeFlags) { f.listen, f.audience = ":9092", "a,b" }, "one audience"},
		{"no idle timeout", func(f *dashboardServeFlags) { f.listen, f.idleTimeout = ":9092", 0 }, "must be positive"},
		{"bad address", func(f *dashboardServeFlags) { f.listen, f.plainHTTP = "9092", true }, "--dashboard-listen \"9092\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := base
			tc.edit(&f.dash)
			err := f.validate()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	for _, ok := range []dashboardServeFlags{
		{listen: ":9092"},
		{listen: ":9092", certFile: "c", keyFile: "k"},
		{listen: "127.0.0.1:9092", plainHTTP: true},
		{listen: "[::1]:9092", plainHTTP: true},
		{listen: "localhost:9092", plainHTTP: true},
	} {
		f := base
		ok.audience, ok.idleTimeout, ok.maxLifetime = "relaymesh-dashboard", time.Minute, time.Hour
		f.dash = ok
		assert.NoError(t, f.validate(), "%+v", ok)
	}
}

// The relay-CA certificate of the dashboard names the server and loopback,
// each once (the CA refuses repeated names).
func TestDashboardNames(t *testing.T) {
	names, ips := dashboardNames(serverFlags{dnsNames: "relaymesh-server,localhost", ips: "127.0.0.1,10.0.0.1"})
	assert.Equal(t, []string{"relaymesh-server", "localhost"}, names)
	var got []string
	for _, ip := range ips {
		got = append(got, ip.String())
	}
	assert.Equal(t, []string{"127.0.0.1", "10.0.0.1", "::1"}, got)
}

// relaymesh dashboard prints the URL with the scheme the dashboard is
// served with, the certificate it saw, and a token command for the
// server's audience; it refuses to forward a plain-HTTP dashboard off
// loopback.
func TestRunDashboardPrintsSchemeCertificateAndAudience(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "relaymesh-server-0", Namespace: "relaymesh", Labels: map[string]string{"app.kubernetes.io/name": "relaymesh-server"},
		CreationTimestamp: metav1.Now()},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "server", Args: []string{"server", "--dashboard-listen=:9092", "--dashboard-audience=dash.example"},
			Ports: []corev1.ContainerPort{{Name: "dashboard", ContainerPort: 9092}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	kube := &kubeclient.Clients{Typed: fake.NewClientset(pod)}
	run := func(srv *httptest.Server, address string) (string, error) {
		_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
		require.NoError(t, err)
		local, _ := strconv.Atoi(port)
		forward := func(ctx context.Context, _ *kubeclient.Clients, p *corev1.Pod, addr string, _, remote int, ready func(int), _ io.Writer) error {
			assert.Equal(t, 9092, remote)
			ready(local)
			return nil
		}
		var out bytes.Buffer
		err = runDashboard(context.Background(), &out, io.Discard, kube, "relaymesh", dashboardFlags{address: address, selector: "app.kubernetes.io/name=relaymesh-server"}, forward)
		return out.String(), err
	}
	h := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})

	tlsSrv := httptest.NewTLSServer(h)
	defer tlsSrv.Close()
	out, err := run(tlsSrv, "127.0.0.1")
	require.NoError(t, err)
	sum := sha256.Sum256(tlsSrv.Certificate().Raw)
	assert.Contains(t, out, "Relaymesh dashboard: https://127.0.0.1:")
	assert.Contains(t, out, hex.EncodeToString(sum[:]))
	assert.Contains(t, out, "kubectl -n relaymesh create token SERVICE-ACCOUNT --audience dash.example")

	plain := httptest.NewServer(h)
	defer plain.Close()
	out, err = run(plain, "127.0.0.1")
	require.NoError(t, err)
	assert.Contains(t, out, "Relaymesh dashboard: http://127.0.0.1:")
	assert.Contains(t, out, "plain HTTP")
	out, err = run(plain, "0.0.0.0")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "forwarded to a loopback --address only")
	assert.False(t, strings.Contains(out, "Relaymesh dashboard:"), "no URL printed: %s", out)
}
