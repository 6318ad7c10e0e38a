package fleet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/relaymesh/relaymesh/test/localcluster"
)

// EnvConfig says where a fleet environment lives and what it runs.
type EnvConfig struct {
	// Dir holds the cluster's data, every log and the audit logs. Required.
	Dir string
	// Binary is the relaymesh binary under test (see ResolveBinary).
	Binary string
	// BinDir holds etcd and kube-apiserver; default .cache/bin.
	BinDir string
	// Namespace of the server; default relaymesh.
	Namespace string
	// FileLimit for this process and the servers it starts; default
	// DefaultFileLimit.
	FileLimit uint64
	// Profiling serves the management kube-apiserver's /debug/pprof.
	Profiling bool
}

// Env is a management cluster (etcd and one kube-apiserver as processes)
// with the harness's clients, ready for servers and fleets.
type Env struct {
	Dir    string
	Binary string
	// Local is the local cluster environment; Cluster its API server.
	Local   *localcluster.Env
	Cluster *localcluster.Cluster
	// Mgmt is the harness's access to the management cluster.
	Mgmt *Management
	// FileLimit is the open-file limit in force.
	FileLimit uint64
}

// StartEnv raises the open-file limit, resolves the binary and starts a
// management cluster.
func StartEnv(ctx context.Context, cfg EnvConfig) (*Env, error) {
	if cfg.Dir == "" {
		return nil, errors.New("fleet env: dir is required")
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "relaymesh"
	}
	if cfg.FileLimit == 0 {
		cfg.FileLimit = DefaultFileLimit
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	limit, err := RaiseFileLimit(cfg.FileLimit)
	if err != nil {
		return nil, err
	}
	bin, err := ResolveBinary(cfg.Binary, dir)
	if err != nil {
		return nil, err
	}
	local, err := localcluster.Start(ctx, localcluster.Config{Dir: filepath.Join(dir, "clusters"), Clusters: []string{"mgmt"}, BinDir: cfg.BinDir, Profiling: cfg.Profiling})
	if err != nil {
		return nil, err
	}
	e := &Env{Dir: dir, Binary: bin, Local: local, Cluster: local.Cluster("mgmt"), FileLimit: limit}
	if e.Mgmt, err = NewManagement(ctx, e.Cluster.RESTConfig(), cfg.Namespace); err != nil {
		_ = local.Stop()
		return nil, err
	}
	return e, nil
}

// StartServer starts a `relaymesh server` named name in the environment's
// namespace, after mod (optional) adjusted its config.
func (e *Env) StartServer(ctx context.Context, name string, mod func(*ServerConfig)) (*Server, error) {
	cfg := ServerConfig{Binary: e.Binary, Kubeconfig: e.Cluster.Kubeconfig, Namespace: e.Mgmt.Namespace, Dir: e.Dir, Name: name}
	if mod != nil {
		mod(&cfg)
	}
	s, err := StartServer(ctx, cfg)
	if err != nil {
		return nil, err
	}
	// The server generates the relay CA on its first start; wait for it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := e.Mgmt.RelayRoots(ctx); err == nil {
			return s, nil
		} else if time.Now().After(deadline) {
			_ = s.Stop()
			return nil, fmt.Errorf("relay CA not published: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Pids are the management cluster's processes, by role.
func (e *Env) Pids() map[string]int {
	pids := e.Local.Pids()
	return map[string]int{"etcd": pids[0], "apiserver": e.Cluster.Pid()}
}

// Stop stops the management cluster.
func (e *Env) Stop() error { return e.Local.Stop() }
