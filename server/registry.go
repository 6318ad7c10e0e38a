package server

import (
	"context"
	"sync"
	"time"
)

// Registration is a cluster the server accepts agents from.
type Registration struct {
	Name string
	// UID identifies this registration (the KubernetesCluster's UID); a
	// re-registered cluster gets a new one. Agent certificates carry it as
	// their subject OU, and a certificate of another registration is refused.
	UID string
	// KubeconfigSecret names the Secret holding the cluster's kubeconfig,
	// for clusters in kubeconfig mode only.
	KubeconfigSecret string
}

// Registry is the set of registered clusters. It is fed by a watch on
// KubernetesCluster objects (WatchClusters) or directly in tests.
type Registry struct {
	mu        sync.RWMutex
	clusters  map[string]Registration
	listeners []func(name string)
	onSet     []func(name string)
	ended     []func(Registration)
	// fetch reads one registration from the source of truth when the
	// watch has not shown it (yet); fetched are the names it added that
	// the watch has not confirmed, with when.
	fetch   func(ctx context.Context, name string) (Registration, bool, error)
	fetched map[string]time.Time
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{clusters: map[string]Registration{}, fetched: map[string]time.Time{}}
}

// SetFetch lets LookupFresh ask the source of truth on a miss: a watch can
// lag (an apiserver closes a watcher that falls behind), and a cluster
// registered a moment ago must not be refused for it.
func (r *Registry) SetFetch(f func(ctx context.Context, name string) (Registration, bool, error)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fetch = f
}

// LookupFresh is Lookup, and on a miss one read of the source of truth
// (SetFetch), whose registration is then kept until the watch confirms or
// removes it (Unconfirmed). Errors are a miss: fail closed.
func (r *Registry) LookupFresh(ctx context.Context, name string) (Registration, bool) {
	if reg, ok := r.Lookup(name); ok || r == nil {
		return reg, ok
	}
	r.mu.RLock()
	fetch := r.fetch
	r.mu.RUnlock()
	if fetch == nil {
		return Registration{}, false
	}
	reg, ok, err := fetch(ctx, name)
	if err != nil || !ok || reg.Name != name {
		return Registration{}, false
	}
	r.mu.Lock()
	if _, had := r.clusters[name]; !had {
		r.fetched[name] = time.Now()
	}
	r.mu.Unlock()
	r.Set(reg)
	return r.Lookup(name)
}

// Watched is Set for a registration the watch shows: it confirms one that
// LookupFresh fetched.
func (r *Registry) Watched(reg Registration) {
	r.mu.Lock()
	delete(r.fetched, reg.Name)
	r.mu.Unlock()
	r.Set(reg)
}

// Unconfirmed are the names LookupFresh added more than age ago that the
// watch has not shown since.
func (r *Registry) Unconfirmed(age time.Duration) []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []string
	for name, at := range r.fetched {
		if time.Since(at) > age {
			out = append(out, name)
		}
	}
	return out
}

// Lookup returns the registration of a cluster. A nil registry has none.
func (r *Registry) Lookup(name string) (Registration, bool) {
	if r == nil {
		return Registration{}, false
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	reg, ok := r.clusters[name]
	return reg, ok
}

// Set adds or replaces a registration. Replacing one with a different UID
// revokes the old registration's sessions.
func (r *Registry) Set(reg Registration) {
	r.mu.Lock()
	old, had := r.clusters[reg.Name]
	r.clusters[reg.Name] = reg
	listeners, onSet, ended := r.listeners, r.onSet, r.ended
	r.mu.Unlock()
	if had && old == reg {
		return
	}
	if had {
		for _, f := range listeners {
			f(reg.Name)
		}
		if old.UID != reg.UID {
			for _, f := range ended {
				f(old)
			}
		}
	}
	for _, f := range onSet {
		f(reg.Name)
	}
}

// OnRegister registers f to be called (synchronously) with the name of
// every cluster that is registered or registered again.
func (r *Registry) OnRegister(f func(name string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onSet = append(r.onSet, f)
}

// Remove deregisters a cluster and notifies listeners.
func (r *Registry) Remove(name string) {
	r.mu.Lock()
	old, had := r.clusters[name]
	delete(r.clusters, name)
	delete(r.fetched, name)
	listeners, ended := r.listeners, r.ended
	r.mu.Unlock()
	if had {
		for _, f := range listeners {
			f(name)
		}
		for _, f := range ended {
			f(old)
		}
	}
}

// OnEnded registers f to be called (synchronously) with every registration
// that ended: its cluster was removed, or registered again under a new UID.
func (r *Registry) OnEnded(f func(Registration)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended = append(r.ended, f)
}

// Names returns the registered cluster names.
func (r *Registry) Names() []string {
	if r == nil {
		return nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.clusters))
	for n := range r.clusters {
		out = append(out, n)
	}
	return out
}

// OnRevoke registers f to be called (synchronously) with the name of every
// cluster that is removed or re-registered.
func (r *Registry) OnRevoke(f func(name string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.listeners = append(r.listeners, f)
}
