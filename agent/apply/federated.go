package apply

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/relaymesh/relaymesh/api/outputs"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// What ambient federation may write, and nothing more: the agent holds
// write access to Services and Gateways with --ambient-federation, so a
// compromised or buggy server must not be able to use it for anything else
// (a LoadBalancer, NodePort or externalIPs Service that intercepts
// traffic, a Gateway of a class that deploys a proxy).
const (
	globalServiceLabel     = "relaymesh.io/global-service"
	labelGlobal            = "istio.io/global"
	remoteGatewayClassName = "istio-remote"
)

var (
	serviceSpecFields = []string{"ports", "selector", "type"}
	servicePortFields = []string{"appProtocol", "name", "port", "protocol", "targetPort"}
)

// checkFederated refuses a core Service, a WorkloadEntry or a Gateway API
// Gateway that is not what ambient federation writes: a ClusterIP Service
// selecting only its own WorkloadEntries (relaymesh.io/global-service:
// <its name>), with plain ports; a WorkloadEntry labelled only that way
// (or, with joinServices, one that joins a user's global Service: see
// checkEntryLabels); a Gateway of class istio-remote.
func (m *manifest) checkFederated(top map[string]any, joinServices bool) {
	spec, _ := top["spec"].(map[string]any)
	switch {
	case m.gvk.Group == "" && m.gvk.Kind == "Service":
		for _, k := range slices.Sorted(maps.Keys(spec)) {
			if !slices.Contains(serviceSpecFields, k) {
				m.problems = append(m.problems, fmt.Sprintf("spec.%s is not allowed in a Service the agent writes (only ports, selector and type ClusterIP)", k))
			}
		}
		if t, ok := spec["type"]; ok && t != "ClusterIP" {
			m.problems = append(m.problems, fmt.Sprintf("spec.type %v is not allowed: the agent writes ClusterIP Services only", t))
		}
		sel, _ := spec["selector"].(map[string]any)
		if len(sel) != 1 || sel[globalServiceLabel] != m.name {
			m.problems = append(m.problems, fmt.Sprintf("spec.selector must be exactly %s: %s (the Service's own WorkloadEntries)", globalServiceLabel, m.name))
		}
		ports, _ := spec["ports"].([]any)
		for i, p := range ports {
			pm, _ := p.(map[string]any)
			for _, k := range slices.Sorted(maps.Keys(pm)) {
				if !slices.Contains(servicePortFields, k) {
					m.problems = append(m.problems, fmt.Sprintf("spec.ports[%d].%s is not allowed in a Service the agent writes", i, k))
				}
			}
		}
	case m.gvk.Group == "networking.istio.io" && m.gvk.Kind == "WorkloadEntry":
		m.checkEntryLabels(top, spec, joinServices)
	case m.gvk.Group == "gateway.networking.k8s.io" && m.gvk.Kind == "Gateway":
		if c, _ := spec["gatewayClassName"].(string); c != remoteGatewayClassName {
			m.problems = append(m.problems, fmt.Sprintf("spec.gatewayClassName %q is not allowed: the agent writes Gateways of class %s only (a remote network's gateway, which deploys nothing)", c, remoteGatewayClassName))
		}
	}
}

// checkEntryLabels checks a WorkloadEntry's labels. By default it must be
// selected only by the global Service of its name: an entry carrying other
// labels could join a user's Service (Services select WorkloadEntries) and
// take its traffic. With joinServices (--ambient-failover) an entry may
// carry other labels, the same in metadata and spec, on a network of its
// own; it is then recorded in m.joins, and the applier lets it through only
// when a Service of that namespace labelled istio.io/global=true by its
// owner selects exactly those labels and the network is not this
// cluster's (Applier.checkJoins).
func (m *manifest) checkEntryLabels(top, spec map[string]any, joinServices bool) {
	md, _ := top["metadata"].(map[string]any)
	metaLabels, _ := md["labels"].(map[string]any)
	specLabels, _ := spec["labels"].(map[string]any)
	federated := func(labels map[string]any) bool {
		s, _ := labels[globalServiceLabel].(string)
		return len(labels) == 1 && s != ""
	}
	if federated(metaLabels) && federated(specLabels) {
		return
	}
	if !joinServices {
		for _, f := range []struct {
			field  string
			labels map[string]any
		}{{"metadata.labels", metaLabels}, {"spec.labels", specLabels}} {
			if !federated(f.labels) {
				m.problems = append(m.problems, fmt.Sprintf("%s must be exactly %s: <service> in a WorkloadEntry the agent writes (entries that join a Service of their own need --ambient-failover)", f.field, globalServiceLabel))
			}
		}
		return
	}
	joins := map[string]string{}
	for k, v := range specLabels {
		s, ok := v.(string)
		if !ok {
			m.problems = append(m.problems, fmt.Sprintf("spec.labels.%s is not a string", k))
			continue
		}
		joins[k] = s
	}
	switch {
	case len(joins) == 0:
		m.problems = append(m.problems, "spec.labels is empty: a WorkloadEntry the agent writes is selected by one Service")
	case len(metaLabels) != len(specLabels) || !sameLabels(metaLabels, joins):
		m.problems = append(m.problems, "metadata.labels and spec.labels differ: an entry that joins a Service carries its selector in both")
	}
	if _, ok := joins[globalServiceLabel]; ok && len(joins) > 1 {
		m.problems = append(m.problems, fmt.Sprintf("spec.labels mixes %s with other labels", globalServiceLabel))
	}
	if n, _ := spec["network"].(string); n == "" {
		m.problems = append(m.problems, "spec.network is empty: an entry that joins a Service must be on another network (reached only through its gateway)")
	} else {
		m.joinNetwork = n
	}
	m.joins = joins
}

func sameLabels(a map[string]any, b map[string]string) bool {
	for k, v := range b {
		if a[k] != v {
			return false
		}
	}
	return len(a) == len(b)
}

var servicesResource = schema.GroupVersionResource{Version: "v1", Resource: "services"}

// checkJoins lets a WorkloadEntry that joins a Service (manifest.joins)
// through only when its network is not this cluster's and a Service of its
// namespace that its owner labelled istio.io/global=true, not one this
// agent wrote, selects exactly its labels; any other is refused, and so
// is every such entry while this cluster's network is unknown or the
// Services cannot be listed (fail closed). A refused entry is taken out of
// keep: one applied while the consent held is pruned once it no longer
// does.
func (a *Applier) checkJoins(ctx context.Context, items []*item, keep map[objectKey]bool) {
	var local []string
	localRead := false
	services := map[string][]unstructured.Unstructured{}
	listErr := map[string]error{}
	for _, it := range items {
		if it.obj == nil || it.joins == nil {
			continue
		}
		if !localRead {
			local, localRead = a.cfg.LocalNetworks(), true
		}
		ns := it.namespace
		if _, done := services[ns]; !done && listErr[ns] == nil {
			l, err := a.cfg.Dynamic.Resource(servicesResource).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: labelGlobal + "=true"})
			if err != nil {
				listErr[ns] = err
			} else {
				services[ns] = l.Items
			}
		}
		var why string
		switch {
		case len(local) == 0:
			why = "this cluster's own network is not known (no discovered mesh reports topology.istio.io/network), so an entry on another network cannot be told apart from its own pods"
		case slices.Contains(local, it.joinNetwork):
			why = fmt.Sprintf("its network %q is this cluster's own: an entry that joins a Service must be on another network", it.joinNetwork)
		case listErr[ns] != nil:
			why = fmt.Sprintf("cannot list the Services of namespace %s: %v", ns, listErr[ns])
		case !a.globalServiceSelects(services[ns], it.joins):
			why = fmt.Sprintf("no Service in namespace %s labelled %s=true by its owner selects exactly %s: an entry joins only a Service its owner made global", ns, labelGlobal, labelsString(it.joins))
		}
		if why != "" {
			it.obj = nil
			it.result.Outcome = OutcomeError
			it.result.Error = "WorkloadEntry refused: " + why
			delete(keep, it.key)
		}
	}
}

// globalServiceSelects says whether one of services, none of them written
// by this agent, selects exactly labels.
func (a *Applier) globalServiceSelects(services []unstructured.Unstructured, labels map[string]string) bool {
	for _, svc := range services {
		if svc.GetLabels()[outputs.OwnerLabel] != "" {
			continue
		}
		sel, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector")
		if len(sel) > 0 && maps.Equal(sel, labels) {
			return true
		}
	}
	return false
}

func labelsString(l map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(l)) {
		parts = append(parts, k+"="+l[k])
	}
	return "{" + strings.Join(parts, ", ") + "}"
}
