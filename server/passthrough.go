package server

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/relaymesh/relaymesh/api/outputs"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
)

// Pass-through outputs: until translation produces each cluster's Istio
// configuration, an operator (or a test) can place Istio objects in the
// server's namespace of the management cluster with the label
// LabelTargetCluster; the server sends them, unchanged but for metadata, to
// that cluster's agent. The mechanism downstream (versions, apply, prune,
// ownership, acks) is the one translation will use.
const (
	LabelTargetCluster        = "relaymesh.io/target-cluster"
	AnnotationTargetNamespace = "relaymesh.io/target-namespace"
)

// PassthroughKinds are the resources the pass-through source watches: the
// resources of the Istio kinds an agent applies by default (outputs.IstioKinds,
// the list apply.DefaultKinds comes from; TestPassthroughKindsMatchApply
// checks they agree).
var PassthroughKinds = outputs.IstioResources()

// Passthrough publishes labelled Istio objects of the management cluster as
// outputs.
type Passthrough struct {
	outputs    *Outputs
	registries []*Registry
	log        *slog.Logger
	informers  []cache.SharedIndexInformer
	mu         sync.Mutex
}

// RunPassthrough starts watching namespace and publishes every registered
// cluster's set once synced (so outputs can be marked ready). It returns
// after the first publication.
func RunPassthrough(ctx context.Context, client dynamic.Interface, namespace string, outputs *Outputs, log *slog.Logger, registries ...*Registry) (*Passthrough, error) {
	p := &Passthrough{outputs: outputs, registries: registries, log: log.With("component", "passthrough")}
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(client, 10*time.Minute, namespace, nil)
	for _, gvr := range PassthroughKinds {
		inf := factory.ForResource(gvr).Informer()
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { p.publish() },
			UpdateFunc: func(any, any) { p.publish() },
			DeleteFunc: func(any) { p.publish() },
		}); err != nil {
			return nil, err
		}
		p.informers = append(p.informers, inf)
	}
	for _, r := range registries {
		// A registration changes one cluster's set: recomputing every
		// cluster's made a storm of N registrations cost N² (a quarter of
		// the server's CPU in a 10,000-agent storm).
		r.OnRevoke(func(name string) { p.publishClusters(name) })
		r.OnRegister(func(name string) { p.publishClusters(name) })
	}
	factory.Start(ctx.Done())
	syncCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for i, inf := range p.informers {
		if !cache.WaitForCacheSync(syncCtx.Done(), inf.HasSynced) {
			return nil, fmt.Errorf("pass-through watch of %s did not sync within a minute (are Istio's CRDs installed in the management cluster?)", PassthroughKinds[i].Resource)
		}
	}
	p.publish()
	return p, nil
}

// Publish recomputes every registered cluster's set (also called when a
// cluster registers).
func (p *Passthrough) Publish() { p.publish() }

func (p *Passthrough) publish() { p.publishClusters() }

// publishClusters recomputes the sets of the named clusters that are
// registered, or of every registered cluster if none is named.
func (p *Passthrough) publishClusters(only ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	sets := map[string][]*relaypb.OutputObject{}
	for _, r := range p.registries {
		if len(only) == 0 {
			for _, c := range r.Names() {
				sets[c] = nil
			}
			continue
		}
		for _, c := range only {
			if _, ok := r.Lookup(c); ok {
				sets[c] = nil
			}
		}
	}
	for _, inf := range p.informers {
		for _, obj := range inf.GetStore().List() {
			u, ok := obj.(*unstructured.Unstructured)
			if !ok {
				continue
			}
			cluster := u.GetLabels()[LabelTargetCluster]
			if _, registered := sets[cluster]; !registered {
				continue
			}
			out, err := passthroughObject(u)
			if err != nil {
				p.log.Warn("skipping pass-through object", "kind", u.GetKind(), "name", u.GetName(), "error", err)
				continue
			}
			sets[cluster] = append(sets[cluster], out)
		}
	}
	names := make([]string, 0, len(sets))
	for c := range sets {
		names = append(names, c)
	}
	sort.Strings(names)
	p.outputs.Batch(func() {
		for _, c := range names {
			p.outputs.SetFrom("passthrough", c, sets[c])
		}
	})
}

// passthroughObject strips a management-cluster object to what the agent
// applies: apiVersion, kind, name, target namespace, user labels and spec.
func passthroughObject(u *unstructured.Unstructured) (*relaypb.OutputObject, error) {
	ns := u.GetNamespace()
	if t := u.GetAnnotations()[AnnotationTargetNamespace]; t != "" {
		ns = t
	}
	labels := map[string]any{}
	for k, v := range u.GetLabels() {
		if k != LabelTargetCluster {
			labels[k] = v
		}
	}
	meta := map[string]any{"name": u.GetName(), "namespace": ns}
	if len(labels) > 0 {
		meta["labels"] = labels
	}
	obj := map[string]any{"apiVersion": u.GetAPIVersion(), "kind": u.GetKind(), "metadata": meta}
	if spec, ok := u.Object["spec"]; ok {
		obj["spec"] = spec
	}
	b, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	return &relaypb.OutputObject{Manifest: b, Parents: []string{u.GetKind() + "/" + u.GetNamespace() + "/" + u.GetName()}}, nil
}
