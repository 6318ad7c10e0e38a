// Package apptest builds the management server's real assembly (app.Run)
// in-process for tests, on a local apiserver of test/localcluster: the
// whole server, its once-only table and its replicas, the way `relaymesh
// server` runs them. It is imported only from _test.go files; it lives
// apart from server/servertest so that the server's and identity's tests
// do not link the whole process (translation, trust, admission).
package apptest

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/syncbuf"
	"github.com/relaymesh/relaymesh/server/app"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// Management starts a local management cluster (localcluster.Management)
// with namespace ns for the test and returns the clients app.Run takes.
func Management(t testing.TB, ns string) *kubeclient.Clients {
	t.Helper()
	mgmt, _, _ := localcluster.Management(t, ns)
	return Clients(t, mgmt)
}

// Clients are an admin's clients of a local cluster.
func Clients(t testing.TB, c *localcluster.Cluster) *kubeclient.Clients {
	t.Helper()
	cfg := c.RESTConfig()
	cfg.QPS, cfg.Burst = 200, 400
	typed, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	dyn, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)
	return &kubeclient.Clients{Config: cfg, Typed: typed, Dynamic: dyn}
}

// AppConfig is app.Default fitted for an in-process test: namespace ns,
// replica name (with leader election), an audit log in a temporary
// directory, every listener on 127.0.0.1:0 (the bound addresses come back
// from StartApp) and Lease timings a loaded machine keeps.
func AppConfig(t testing.TB, ns, replica string) app.Config {
	cfg := app.Default()
	cfg.Namespace, cfg.ReplicaName = ns, replica
	cfg.AuditLog = filepath.Join(t.TempDir(), "audit.log")
	cfg.Listen, cfg.MetricsListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 6*time.Second, 4*time.Second, 500*time.Millisecond
	return cfg
}

// App is a whole management server, app.Run's assembly, in-process.
type App struct {
	Config app.Config
	// Addrs are the addresses it bound.
	Addrs app.Addresses
	// Metrics is its registry.
	Metrics   *prometheus.Registry
	Logs      *syncbuf.Buffer
	stop      context.CancelFunc
	done      chan error
	listening chan app.Addresses
}

// StartApp runs app.Run(cfg) on kube until Stop or the test's end, and
// returns once it serves (failing the test if it returns first).
func StartApp(t testing.TB, kube *kubeclient.Clients, cfg app.Config) *App {
	t.Helper()
	a := LaunchApp(t, kube, cfg)
	a.WaitServing(t)
	return a
}

// LaunchApp starts app.Run(cfg) on kube and returns at once; WaitServing
// waits until it serves. Several replicas launched together start
// together, as a Deployment's do.
func LaunchApp(t testing.TB, kube *kubeclient.Clients, cfg app.Config) *App {
	ctx, cancel := context.WithCancel(context.Background())
	a := &App{Config: cfg, Metrics: prometheus.NewRegistry(), Logs: &syncbuf.Buffer{}, stop: cancel, done: make(chan error, 1),
		listening: make(chan app.Addresses, 1)}
	deps := app.Deps{Kube: kube, Registry: a.Metrics,
		Logger:    slog.New(slog.NewJSONHandler(a.Logs, &slog.HandlerOptions{Level: slog.LevelDebug})).With("replica", cfg.ReplicaName),
		Listening: func(addrs app.Addresses) { a.listening <- addrs }}
	go func() { a.done <- app.Run(ctx, cfg, deps) }()
	t.Cleanup(func() { _ = a.Stop() })
	return a
}

// WaitServing waits until the server serves and records its addresses,
// failing the test if Run returns first.
func (a *App) WaitServing(t testing.TB) {
	t.Helper()
	select {
	case a.Addrs = <-a.listening:
	case err := <-a.done:
		a.done <- err
		t.Fatalf("the server %q stopped before it served: %v\n%s", a.Config.ReplicaName, err, a.Logs)
	case <-time.After(2 * time.Minute):
		t.Fatalf("the server %q did not serve within 2 minutes\n%s", a.Config.ReplicaName, a.Logs)
	}
}

// Stop ends the server and returns what Run returned (nil: a clean stop);
// it may be called again.
func (a *App) Stop() error {
	a.stop()
	err := <-a.done
	a.done <- err
	return err
}

// Series are the values of metric name (gauge or counter) by the value of
// label.
func (a *App) Series(t testing.TB, name, label string) map[string]float64 {
	t.Helper()
	families, err := a.Metrics.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			out[labelOf(m, label)] = valueOf(m)
		}
	}
	return out
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func valueOf(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	}
	return 0
}
