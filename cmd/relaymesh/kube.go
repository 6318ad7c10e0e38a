package main

import (
	"fmt"
	"io"
	"log/slog"
	"strings"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// kubeClients are the clients of one cluster.
type kubeClients struct {
	config  *rest.Config
	typed   kubernetes.Interface
	dynamic dynamic.Interface
}

// loadKube builds clients from a kubeconfig path, or from the in-cluster
// service account when path is empty, limited to 50 requests a second.
func loadKube(path string) (*kubeClients, error) { return loadKubeQPS(path, 50) }

// loadKubeQPS is loadKube with a client limit of qps (burst twice that).
func loadKubeQPS(path string, qps float32) (*kubeClients, error) {
	var cfg *rest.Config
	var err error
	if path == "" {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no --kubeconfig given and not running in a cluster: %w", err)
		}
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
	}
	cfg.QPS, cfg.Burst = qps, int(2*qps)
	typed, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &kubeClients{config: cfg, typed: typed, dynamic: dyn}, nil
}

// newLogger returns a JSON logger at level ("debug", "info", "warn", "error").
func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})), nil
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
