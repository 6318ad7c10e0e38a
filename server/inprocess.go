package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/relaymesh/relaymesh/agent/apply"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/discovery"
	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	discoveryclient "k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
)

// ParseKubeconfig turns a kubeconfig from a Secret into a client config,
// refusing anything that would make the server run a program or read its
// own files: exec credential plugins, auth providers, and file references
// (certificate, key, CA or token files). Only inline data is accepted.
func ParseKubeconfig(raw []byte) (*rest.Config, error) {
	if len(raw) > 1<<20 {
		return nil, fmt.Errorf("kubeconfig is %d bytes, at most 1 MiB", len(raw))
	}
	cfg, err := clientcmd.Load(raw)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	ctxName := cfg.CurrentContext
	kctx, ok := cfg.Contexts[ctxName]
	if !ok {
		return nil, fmt.Errorf("kubeconfig: current context %q not found", ctxName)
	}
	if ai := cfg.AuthInfos[kctx.AuthInfo]; ai != nil {
		switch {
		case ai.Exec != nil:
			return nil, errors.New("kubeconfig: exec credential plugins are refused (the server would run them)")
		case ai.AuthProvider != nil:
			return nil, errors.New("kubeconfig: auth providers are refused")
		case ai.ClientCertificate != "" || ai.ClientKey != "" || ai.TokenFile != "":
			return nil, errors.New("kubeconfig: file references are refused; embed client-certificate-data, client-key-data or token")
		}
	}
	if c := cfg.Clusters[kctx.Cluster]; c != nil && c.CertificateAuthority != "" {
		return nil, errors.New("kubeconfig: file references are refused; embed certificate-authority-data")
	}
	if c := cfg.Clusters[kctx.Cluster]; c != nil && c.InsecureSkipTLSVerify {
		return nil, errors.New("kubeconfig: insecure-skip-tls-verify is refused")
	}
	return clientcmd.NewDefaultClientConfig(*cfg, &clientcmd.ConfigOverrides{}).ClientConfig()
}

// InProcessAgents runs the agent logic (discovery, apply) inside the server
// for clusters registered in kubeconfig mode, with the credentials of the
// Secret the KubernetesCluster names. It is the seed product's model and the
// weaker one: whoever controls the server controls those clusters. Relay
// mode stays the default; this runs only when the server was started with
// --allow-kubeconfig-clusters, and says so in its log for every cluster.
//
// The agents run only inside Run: with several server replicas, Run is
// once-only work under the Lease, so one replica at a time discovers and
// applies to a kubeconfig-mode cluster.
type InProcessAgents struct {
	secrets   kubernetes.Interface // management cluster
	namespace string
	reg       *Registry
	view      *View
	outputs   *Outputs
	log       *slog.Logger

	mu      sync.Mutex
	term    context.Context          // Run's context while it runs, else nil
	running map[string]*inProcessRun // by cluster
}

type inProcessRun struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// NewInProcessAgents follows reg: while Run runs, every cluster of reg has
// an in-process agent, started and stopped as reg changes. A revoked
// cluster leaves the view whether or not Run runs.
func NewInProcessAgents(secrets kubernetes.Interface, namespace string, reg *Registry, view *View, outputs *Outputs, log *slog.Logger) *InProcessAgents {
	a := &InProcessAgents{secrets: secrets, namespace: namespace, reg: reg, view: view, outputs: outputs,
		log: log.With("component", "in-process-agent"), running: map[string]*inProcessRun{}}
	reg.OnRegister(func(name string) {
		if r, ok := reg.Lookup(name); ok {
			a.start(r)
		}
	})
	reg.OnRevoke(func(name string) {
		a.stop(name)
		if _, ok := reg.Lookup(name); !ok {
			view.Remove(name)
		}
	})
	return a
}

// Run runs an agent for every registered cluster until ctx ends. Then it
// stops them, waits for them, and forgets their snapshots (View.Release):
// the replica that runs them next owns the clusters' discovered objects.
// It returns the clusters it released.
func (a *InProcessAgents) Run(ctx context.Context) (released []string) {
	a.mu.Lock()
	a.term = ctx
	a.mu.Unlock()
	for _, name := range a.reg.Names() {
		if r, ok := a.reg.Lookup(name); ok {
			a.start(r)
		}
	}
	<-ctx.Done()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.term = nil
	for name := range a.running {
		released = append(released, name)
	}
	sort.Strings(released)
	for _, name := range released {
		a.stopLocked(name)
		a.view.Release(name)
	}
	return released
}

// start replaces the cluster's agent if Run runs: the old one is stopped
// and waited for under the lock, so two never apply to the same cluster.
func (a *InProcessAgents) start(r Registration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.term == nil || a.term.Err() != nil {
		return
	}
	a.stopLocked(r.Name)
	ctx, cancel := context.WithCancel(a.term)
	run := &inProcessRun{cancel: cancel, done: make(chan struct{})}
	a.running[r.Name] = run
	a.log.Warn("managing a cluster in kubeconfig mode: the server holds its credentials (relay mode is the secure choice)", "cluster", r.Name, "secret", r.KubeconfigSecret)
	go func() {
		defer close(run.done)
		for attempt := 0; ctx.Err() == nil; attempt++ {
			err := a.run(ctx, r)
			if ctx.Err() != nil {
				return
			}
			a.view.Refused(r.Name, err.Error())
			a.log.Error("in-process agent failed; restarting", "cluster", r.Name, "error", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(min(time.Duration(attempt+1)*2*time.Second, 30*time.Second)):
			}
		}
	}()
}

func (a *InProcessAgents) stop(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stopLocked(name)
}

func (a *InProcessAgents) stopLocked(name string) {
	if run := a.running[name]; run != nil {
		run.cancel()
		<-run.done
		delete(a.running, name)
	}
}

// run is one life of a cluster's in-process agent.
func (a *InProcessAgents) run(ctx context.Context, r Registration) error {
	sec, err := a.secrets.CoreV1().Secrets(a.namespace).Get(ctx, r.KubeconfigSecret, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("kubeconfig secret %s/%s: %w", a.namespace, r.KubeconfigSecret, err)
	}
	raw := sec.Data[multiclusterv1alpha1.KubeconfigKey]
	if len(raw) == 0 {
		return fmt.Errorf("kubeconfig secret %s/%s has no key %q", a.namespace, r.KubeconfigSecret, multiclusterv1alpha1.KubeconfigKey)
	}
	cfg, err := ParseKubeconfig(raw)
	if err != nil {
		return fmt.Errorf("kubeconfig secret %s/%s: %w", a.namespace, r.KubeconfigSecret, err)
	}
	typed, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dc, err := discoveryclient.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	log := a.log.With("cluster", r.Name)
	disc, err := discovery.New(discovery.Config{Client: typed, Cluster: r.Name, Logger: log})
	if err != nil {
		return err
	}
	applier, err := apply.New(apply.Config{Dynamic: dyn, Mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)), Owner: "relaymesh-agent", Logger: log})
	if err != nil {
		return err
	}
	// Every goroutine of this life ends before run returns: a stopped
	// agent must not put a snapshot into the view afterwards.
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 3)
	wg.Go(func() { errc <- disc.Run(ctx) })
	select {
	case <-ctx.Done():
		return ctx.Err()
	case err := <-errc:
		return fmt.Errorf("discovery: %w", err)
	case <-disc.Synced():
	}
	wg.Go(func() { errc <- a.pushLoop(ctx, r.Name, disc) })
	wg.Go(func() { errc <- a.pullLoop(ctx, r.Name, applier) })
	select {
	case <-ctx.Done():
		return ctx.Err()
	case err := <-errc:
		return err
	}
}

// pushLoop puts every changed snapshot into the view, checked like a pushed one.
func (a *InProcessAgents) pushLoop(ctx context.Context, cluster string, disc *discovery.Discoverer) error {
	var last string
	for {
		snap, err := disc.Snapshot()
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil // stopped: a deregistered cluster must not reappear in the view
		}
		if snap.GetHash() != last {
			// Nothing travels in one message here: the size limit is a
			// chunked push's.
			if err := relay.ValidateSnapshot(cluster, snap, relay.SnapshotLimits{MaxBytes: relay.SnapshotLimits{}.WithDefaults().MaxChunkedBytes}); err != nil {
				a.view.Refused(cluster, err.Error())
			} else {
				a.view.Accept(cluster, snap, time.Now())
				last = snap.GetHash()
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-disc.Changes():
		}
	}
}

// pullLoop applies every new output set of cluster and records the results.
func (a *InProcessAgents) pullLoop(ctx context.Context, cluster string, applier *apply.Applier) error {
	select {
	case <-ctx.Done():
		return nil
	case <-a.outputs.Ready():
	}
	changed, cancel := a.outputs.Subscribe(cluster)
	defer cancel()
	var applied uint64
	for {
		set := a.outputs.Get(cluster)
		if set != nil && set.GetVersion() != applied {
			results, err := applier.Apply(ctx, set)
			if err != nil {
				if errors.Is(err, context.Canceled) {
					return nil
				}
				results = []*relaypb.ObjectResult{{Outcome: apply.OutcomeError, Error: "whole set refused: " + err.Error()}}
			}
			// Shared trust needs an agent in the cluster: here the
			// intermediate key would be generated in the management
			// server, outside the cluster it is for. Say so instead of
			// doing it.
			for _, req := range set.GetTrust() {
				results = append(results, &relaypb.ObjectResult{ApiVersion: "v1", Kind: "Secret", Namespace: req.GetNamespace(), Name: "cacerts",
					Outcome: apply.OutcomeError, Error: "shared trust is not available in kubeconfig mode (the intermediate key must be generated in the cluster by an agent): register the cluster in relay mode"})
			}
			a.view.Acked(cluster, &relaypb.PullAck{Version: set.GetVersion(), Results: results}, time.Now())
			applied = set.GetVersion()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}
