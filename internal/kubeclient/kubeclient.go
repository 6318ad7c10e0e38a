// Package kubeclient loads cluster credentials the way kubectl does, through
// client-go's standard loading rules: an explicit kubeconfig file if one is
// named, else the files of $KUBECONFIG (merged, first one wins per key),
// else ~/.kube/config, and when none of them holds a configuration, the
// in-cluster service account. A context picks the cluster and user; empty
// means the kubeconfig's current context.
//
// Relaymesh's commands often talk to two kinds of cluster at once (the
// management cluster and workload clusters); each side is a Source of its
// own, so one merged kubeconfig with a context per cluster serves them all.
package kubeclient

import (
	"errors"
	"fmt"
	"slices"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Source says where one cluster's credentials come from.
type Source struct {
	// Kubeconfig is an explicit kubeconfig file; empty: $KUBECONFIG,
	// ~/.kube/config, then the in-cluster service account.
	Kubeconfig string
	// Context is the kubeconfig context; empty: the current context.
	Context string
	// QPS and Burst bound the client's request rate; default 50 and 100.
	QPS   float32
	Burst int
}

// Clients are the clients of one cluster.
type Clients struct {
	// Context is the name of the context the clients were built from;
	// empty for the in-cluster service account.
	Context string
	Config  *rest.Config
	Typed   kubernetes.Interface
	Dynamic dynamic.Interface
}

// ErrNoConfiguration means no kubeconfig was found and the process does
// not run in a cluster.
var ErrNoConfiguration = errors.New("no kubeconfig: set KUBECONFIG, use --kubeconfig, or write ~/.kube/config (kubectl config view shows what is found)")

func (s Source) rules() *clientcmd.ClientConfigLoadingRules {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = s.Kubeconfig
	return rules
}

// ClientConfig is the source as a client-go ClientConfig (what kubectl
// and Helm take), with namespace as its namespace when not empty.
func (s Source) ClientConfig(namespace string) clientcmd.ClientConfig {
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(s.rules(), &clientcmd.ConfigOverrides{CurrentContext: s.Context, Context: clientcmdapi.Context{Namespace: namespace}})
}

func (s Source) clientConfig() clientcmd.ClientConfig {
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(s.rules(), &clientcmd.ConfigOverrides{CurrentContext: s.Context})
}

// String names the source for messages: the context, and the file when one
// was named.
func (s Source) String() string {
	name := s.Context
	if name == "" {
		name = "current context"
	} else {
		name = "context " + name
	}
	if s.Kubeconfig != "" {
		name += " of " + s.Kubeconfig
	}
	return name
}

// Raw returns the merged kubeconfig (without the in-cluster fallback).
func (s Source) Raw() (clientcmdapi.Config, error) {
	return s.clientConfig().RawConfig()
}

// Contexts lists the context names of the merged kubeconfig, sorted.
func (s Source) Contexts() ([]string, error) {
	raw, err := s.Raw()
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(raw.Contexts))
	for n := range raw.Contexts {
		names = append(names, n)
	}
	slices.Sort(names)
	return names, nil
}

// HasContext reports whether the merged kubeconfig has a context name.
func (s Source) HasContext(name string) bool {
	raw, err := s.Raw()
	if err != nil {
		return false
	}
	_, ok := raw.Contexts[name]
	return ok
}

// RESTConfig builds the client configuration of the source.
func (s Source) RESTConfig() (*rest.Config, string, error) {
	cc := s.clientConfig()
	cfg, err := cc.ClientConfig()
	if err != nil {
		if clientcmd.IsEmptyConfig(err) {
			if s.Kubeconfig != "" {
				// The file was named and read, and selects no cluster
				// (client-go says so alike for an empty file, one with
				// no current context, and a context naming a cluster the
				// file lacks): not a reason to look for $KUBECONFIG.
				return nil, "", fmt.Errorf("kubeconfig %s selects no cluster: it is empty, has no current context, or its context names a cluster it does not define (kubectl config view --kubeconfig %s shows it; --context picks one)", s.Kubeconfig, s.Kubeconfig)
			}
			return nil, "", ErrNoConfiguration
		}
		return nil, "", fmt.Errorf("kubeconfig (%s): %w", s, err)
	}
	name := s.Context
	if raw, err := cc.RawConfig(); err == nil && name == "" {
		name = raw.CurrentContext
	}
	cfg.QPS, cfg.Burst = 50, 100
	if s.QPS > 0 {
		cfg.QPS = s.QPS
	}
	if s.Burst > 0 {
		cfg.Burst = s.Burst
	}
	return cfg, name, nil
}

// Load builds the typed and dynamic clients of the source.
func (s Source) Load() (*Clients, error) {
	cfg, name, err := s.RESTConfig()
	if err != nil {
		return nil, err
	}
	return NewClients(cfg, name)
}

// NewClients builds clients from a client configuration.
func NewClients(cfg *rest.Config, context string) (*Clients, error) {
	typed, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Clients{Context: context, Config: cfg, Typed: typed, Dynamic: dyn}, nil
}

// OwnBudget is a copy of cfg whose clients get a rate limiter of their
// own, qps requests a second with burst (qps 0: cfg's QPS and Burst), so
// that requests queued in cfg's clients never delay theirs: the server's
// status writes and Leases, the agent's Lease. cfg is not changed.
func OwnBudget(cfg *rest.Config, qps float32, burst int) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.RateLimiter = nil
	if qps > 0 {
		c.QPS, c.Burst = qps, burst
	}
	return c
}
