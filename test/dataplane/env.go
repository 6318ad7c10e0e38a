package dataplane

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relaymesh/relaymesh/test/istiod"
	"github.com/relaymesh/relaymesh/test/localcluster"
)

// EnvConfig says which clusters to start.
type EnvConfig struct {
	// Dir holds everything: cluster data, istiod working directories,
	// workload certificates. Required.
	Dir string
	// Clusters are the workload clusters: each gets an istiod and runs
	// workloads. At least one.
	Clusters []string
	// Others are clusters without istiod (a management cluster, for one).
	Others []string
	// TrustDomain of a cluster's mesh; default "<cluster>.local".
	TrustDomain func(cluster string) string
	// Root signs every mesh's intermediate (one shared root, as a
	// VirtualMesh with shared trust has); default a new one.
	Root *Root
	// Log receives the harness's events; default: discarded.
	Log *slog.Logger
}

// Env is a set of local clusters with an istiod per workload cluster.
type Env struct {
	// Local are the clusters.
	Local *localcluster.Env
	// Root is the shared root of every mesh.
	Root *Root
	// IPs is the one address pool of all workloads: addresses are unique
	// across clusters, as on a flat network.
	IPs *IPPool

	clusters map[string]*Cluster
	istiods  []*istiod.Istiod // started, but owned by no Cluster
}

// StartEnv starts the clusters, then an istiod per workload cluster with an
// intermediate from the shared root in its cacerts; it returns once every
// istiod is ready. On error everything started is stopped.
func StartEnv(ctx context.Context, cfg EnvConfig) (_ *Env, err error) {
	if cfg.Dir == "" || len(cfg.Clusters) == 0 {
		return nil, errors.New("dataplane env: dir and at least one cluster are required")
	}
	if cfg.TrustDomain == nil {
		cfg.TrustDomain = func(c string) string { return c + ".local" }
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Root == nil {
		if cfg.Root, err = NewRoot("dataplane"); err != nil {
			return nil, err
		}
	}
	// A random B of 10.B/16 and 127.B/16 per environment: two runs on
	// one machine do not bind the same addresses.
	b, err := rand.Int(rand.Reader, big.NewInt(200))
	if err != nil {
		return nil, err
	}
	second := byte(20 + b.Int64())
	if second == 96 {
		second = 97
	}
	ips, err := NewIPPool(second)
	if err != nil {
		return nil, err
	}
	local, err := localcluster.Start(ctx, localcluster.Config{Dir: filepath.Join(cfg.Dir, "clusters"), Clusters: append(append([]string{}, cfg.Others...), cfg.Clusters...)})
	if err != nil {
		return nil, err
	}
	e := &Env{Local: local, Root: cfg.Root, IPs: ips, clusters: map[string]*Cluster{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.Stop())
		}
	}()
	// istiods start side by side: each takes seconds, mostly waiting.
	type started struct {
		d   *istiod.Istiod
		c   *Cluster
		err error
	}
	results := make([]started, len(cfg.Clusters))
	var wg sync.WaitGroup
	for i, name := range cfg.Clusters {
		wg.Go(func() {
			d, c, err := startIstiod(ctx, cfg, local.Cluster(name), ips)
			results[i] = started{d, c, err}
		})
	}
	wg.Wait()
	var errs []error
	for i, r := range results {
		switch {
		case r.c != nil: // the cluster owns its istiod
			e.clusters[cfg.Clusters[i]] = r.c
		case r.d != nil:
			e.istiods = append(e.istiods, r.d)
		}
		errs = append(errs, r.err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return e, nil
}

// startIstiod gives a cluster its istio-system namespace, a cacerts from the
// shared root and a running istiod.
func startIstiod(ctx context.Context, cfg EnvConfig, lc *localcluster.Cluster, ips *IPPool) (*istiod.Istiod, *Cluster, error) {
	kube, err := lc.Clientset()
	if err != nil {
		return nil, nil, err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: istiod.DefaultNamespace}}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, nil, err
	}
	cacerts, err := cfg.Root.CACerts(ctx, "istiod-"+lc.Name, cfg.TrustDomain(lc.Name))
	if err != nil {
		return nil, nil, err
	}
	start := time.Now()
	icfg := istiod.Config{
		Kubeconfig: lc.Kubeconfig, ClusterID: lc.Name, Dir: filepath.Join(cfg.Dir, "istiod-"+lc.Name),
		CACerts: cacerts, TrustDomain: cfg.TrustDomain(lc.Name),
	}
	d, err := istiod.Start(ctx, icfg)
	if err != nil {
		return nil, nil, err
	}
	cfg.Log.Info("istiod ready", "cluster", lc.Name, "after", time.Since(start).Round(time.Millisecond), "xds", d.Addresses().GRPC)
	c, err := NewCluster(ClusterConfig{Cluster: lc, Istiod: d, IstiodConfig: icfg, Dir: filepath.Join(cfg.Dir, "workloads-"+lc.Name), IPs: ips, Log: cfg.Log})
	if err != nil {
		return d, nil, err
	}
	return d, c, nil
}

// Cluster returns the named workload cluster, or nil.
func (e *Env) Cluster(name string) *Cluster { return e.clusters[name] }

// Stop stops every istiod, then the clusters.
func (e *Env) Stop() error {
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range e.clusters {
		errs = append(errs, c.StopWorkloads(ctx))
	}
	for _, c := range e.clusters {
		errs = append(errs, c.StopIstiod())
	}
	for _, d := range e.istiods {
		errs = append(errs, d.Stop())
	}
	if e.Local != nil {
		errs = append(errs, e.Local.Stop())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("dataplane env: stop: %w", err)
	}
	return nil
}
