package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/relay"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const agentSynopsis = `Runs the relay agent in a workload cluster. It dials out to the management
server: once with the bootstrap token of relay-identity-token-secret over
server-authenticated TLS pinned to relay-root-tls-secret, then always with
mTLS and the client certificate it keeps in relay-client-tls-secret and
renews at about 2/3 of its life. It never falls back to an insecure
connection.

--cluster and --server-address default to the values 'relaymesh cluster
register' wrote into the ConfigMap relaymesh-agent-config.`

// Agent metric names (docs/metrics.md).
const (
	metricAgentCertExpiry = "relaymesh_agent_client_certificate_expiry_timestamp_seconds"
	metricAgentConnected  = "relaymesh_agent_relay_connected"
)

// agentConfigMap is where registration leaves the agent's settings.
const agentConfigMap = "relaymesh-agent-config"

func runAgent(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var kubeconfig, namespace, cluster, serverAddr, serverName, healthListen, metricsListen, logLevel string
	fs := newFlags("agent [flags]", agentSynopsis, stderr)
	fs.StringVar(&kubeconfig, "kubeconfig", "", "workload cluster kubeconfig (default: in-cluster service account)")
	fs.StringVar(&namespace, "namespace", "relaymesh", "namespace of the agent's secrets")
	fs.StringVar(&cluster, "cluster", "", "this cluster's registered name (default: from "+agentConfigMap+")")
	fs.StringVar(&serverAddr, "server-address", "", "relay server host:port (default: from "+agentConfigMap+")")
	fs.StringVar(&serverName, "server-name", "", "name the server certificate must carry (default: host of --server-address)")
	fs.StringVar(&healthListen, "health-listen", ":9988", "health address (/healthz, /readyz with JSON status)")
	fs.StringVar(&metricsListen, "metrics-listen", ":9977", "metrics address (/metrics)")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	log, err := newLogger(stderr, logLevel)
	if err != nil {
		return err
	}
	kube, err := loadKube(kubeconfig)
	if err != nil {
		return err
	}
	if cluster == "" || serverAddr == "" {
		cm, err := kube.typed.CoreV1().ConfigMaps(namespace).Get(ctx, agentConfigMap, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("read %s/%s: %w", namespace, agentConfigMap, err)
		}
		if err == nil {
			if cluster == "" {
				cluster = cm.Data["cluster"]
			}
			if serverAddr == "" {
				serverAddr = cm.Data["serverAddress"]
			}
		}
	}
	if cluster == "" || serverAddr == "" {
		return errors.New("--cluster and --server-address are required (or register the cluster first: relaymesh cluster register)")
	}
	log = log.With("cluster", cluster)
	secrets, err := identity.NewKubeAgentSecrets(kube.typed, namespace)
	if err != nil {
		return err
	}
	creds, err := identity.NewManager(identity.ManagerConfig{
		Cluster: cluster, ServerAddress: serverAddr, ServerName: serverName, Secrets: secrets, Version: version(), Logger: log,
	})
	if err != nil {
		return err
	}
	session, err := relay.NewSession(relay.SessionConfig{ServerAddress: serverAddr, TLS: creds.ClientTLS, Version: version(), Logger: log, OnRefused: creds.Refused})
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricAgentCertExpiry, Help: "Expiry (Unix seconds) of the agent's current client certificate; 0 when it has none."},
			func() float64 {
				if st := creds.Status(); st.Ready {
					return float64(st.NotAfter.Unix())
				}
				return 0
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: metricAgentConnected, Help: "1 while the agent holds an open relay session."},
			func() float64 {
				if session.State().Connected {
					return 1
				}
				return 0
			}))
	status := func() (any, error) {
		st := struct {
			Credential identity.Status    `json:"credential"`
			Session    relay.SessionState `json:"session"`
		}{creds.Status(), session.State()}
		switch {
		case !st.Credential.Ready:
			return st, errors.New(st.Credential.Message)
		case !st.Session.Connected:
			return st, errors.New("not connected to the relay server")
		}
		return st, nil
	}
	health := http.NewServeMux()
	health.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	health.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		st, err := status()
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"ok": err == nil, "error": errString(err), "status": st})
	})
	for addr, h := range map[string]http.Handler{healthListen: health, metricsListen: opsMux(reg, func() error { _, err := status(); return err })} {
		lis, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(lis) }()
		defer srv.Close()
	}

	log.Info("relay agent starting", "server", serverAddr, "namespace", namespace)
	go func() { _ = creds.Run(ctx) }()
	select {
	case <-ctx.Done():
		return nil
	case <-creds.Ready():
	}
	if err := session.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
