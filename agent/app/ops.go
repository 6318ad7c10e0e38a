package app

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/relaymesh/relaymesh/agent"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/internal/opshttp"
)

// Agent metric names (docs/metrics.md).
const (
	metricAgentCertExpiry = "relaymesh_agent_client_certificate_expiry_timestamp_seconds"
	metricAgentConnected  = "relaymesh_agent_relay_connected"
)

// registry is the agent's own metrics registry.
func (p *parts) registry(version string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), opshttp.BuildInfo(version),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricAgentCertExpiry, Help: "Expiry (Unix seconds) of the agent's current client certificate; 0 when it has none."},
			func() float64 {
				if st := p.creds.Status(); st.Ready {
					return float64(st.NotAfter.Unix())
				}
				return 0
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricAgentConnected, Help: "1 while the agent holds an open relay session."},
			func() float64 {
				if p.session.State().Connected {
					return 1
				}
				return 0
			}))
	return reg
}

// status is what /readyz reports, and why the agent is not ready: a
// standby is; a leader is once it holds a credential and a session.
func (p *parts) status() (any, error) {
	st := struct {
		Leader     bool               `json:"leader"`
		Credential identity.Status    `json:"credential"`
		Session    agent.SessionState `json:"session"`
		// NoWaypoints says why discovery reports no waypoint (degraded,
		// not unready: the rest of discovery runs).
		NoWaypoints string `json:"noWaypoints,omitempty"`
	}{Leader: p.leading.Load() || !p.leaderElect, Credential: p.creds.Status(), Session: p.session.State()}
	select {
	case <-p.disc.Synced():
		st.NoWaypoints = p.disc.WaypointsUnavailable()
	default:
	}
	switch {
	case !st.Leader:
		return st, nil // a healthy standby
	case !st.Credential.Ready:
		return st, errors.New(st.Credential.Message)
	case !st.Session.Connected && st.Session.RelayTrust != "":
		return st, errors.New("not connected to the relay server: " + st.Session.RelayTrust)
	case !st.Session.Connected:
		return st, errors.New("not connected to the relay server")
	}
	return st, nil
}

// healthMux serves /healthz and /readyz with the JSON status.
func (p *parts) healthMux() *http.ServeMux {
	health := http.NewServeMux()
	health.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	health.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		st, err := p.status()
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"ok": err == nil, "error": errString(err), "status": st})
	})
	return health
}

// serveOps serves health on --health-listen and metrics on
// --metrics-listen; the function it returns stops both.
func (p *parts) serveOps(cfg Config, version string, log *slog.Logger) (stop func(), err error) {
	var servers []*http.Server
	stop = func() {
		for _, s := range servers {
			_ = s.Close()
		}
	}
	ready := func() error { _, err := p.status(); return err }
	for _, l := range []struct {
		flag, addr, def string
		h               http.Handler
	}{
		{"--health-listen", cfg.HealthListen, defaultAgentHealth, p.healthMux()},
		{"--metrics-listen", cfg.MetricsListen, defaultAgentMetrics, opshttp.Mux(p.registry(version), ready)},
	} {
		lis, err := listenOps(l.flag, l.addr, l.def, log)
		if err != nil {
			stop()
			return nil, err
		}
		srv := &http.Server{Handler: l.h, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(lis) }()
		servers = append(servers, srv)
	}
	return stop, nil
}

// listenOps listens on addr for flag. At the default address, held by
// another agent on this machine (by-hand use), it takes a free loopback
// port instead and logs it; an address given explicitly is never replaced.
func listenOps(flag, addr, def string, log *slog.Logger) (net.Listener, error) {
	lis, err := net.Listen("tcp", addr)
	if err == nil {
		log.Info("listening", "flag", flag, "address", lis.Addr().String())
		return lis, nil
	}
	if addr != def || !errors.Is(err, syscall.EADDRINUSE) {
		return nil, fmt.Errorf("%s %s: %w (another process on this machine holds it? give each agent its own %s)", flag, addr, err, flag)
	}
	lis, err2 := net.Listen("tcp", "127.0.0.1:0")
	if err2 != nil {
		return nil, fmt.Errorf("%s %s: %w; and no free loopback port: %w", flag, addr, err, err2)
	}
	log.Warn("the default address is in use (another agent on this machine?): listening on a free loopback port instead; set the flag to choose one",
		"flag", flag, "default", def, "address", lis.Addr().String())
	return lis, nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
