// Package opshttp serves a process's operations endpoints, the same way for
// the server and the agent: /metrics from the process's own registry,
// /healthz (the process is up) and /readyz, and the relaymesh_build_info
// gauge that `relaymesh version` reads.
package opshttp

import (
	"fmt"
	"net/http"
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/relaymesh/relaymesh/internal/opsclient"
)

// Mux serves /metrics, /healthz (process up) and /readyz (ready's error,
// as 503, else ok).
func Mux(reg *prometheus.Registry, ready func() error) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// BuildInfo is the relaymesh_build_info gauge of the server and the agent.
func BuildInfo(version string) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: opsclient.BuildInfoMetric,
		Help: "Always 1; the labels say which relaymesh build this is (relaymesh version reads it)."}, []string{"version", "go_version"})
	g.WithLabelValues(version, runtime.Version()).Set(1)
	return g
}
