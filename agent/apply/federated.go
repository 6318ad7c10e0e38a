package apply

import (
	"fmt"
	"maps"
	"slices"
)

// What ambient federation may write, and nothing more: the agent holds
// write access to Services and Gateways with --ambient-federation, so a
// compromised or buggy server must not be able to use it for anything else
// (a LoadBalancer, NodePort or externalIPs Service that intercepts
// traffic, a Gateway of a class that deploys a proxy).
const (
	globalServiceLabel     = "relaymesh.io/global-service"
	remoteGatewayClassName = "istio-remote"
)

var (
	serviceSpecFields = []string{"ports", "selector", "type"}
	servicePortFields = []string{"appProtocol", "name", "port", "protocol", "targetPort"}
)

// checkFederated refuses a core Service, a WorkloadEntry or a Gateway API
// Gateway that is not what ambient federation writes: a ClusterIP Service
// selecting only its own WorkloadEntries (relaymesh.io/global-service:
// <its name>), with plain ports; a WorkloadEntry labelled only that way;
// a Gateway of class istio-remote.
func (m *manifest) checkFederated(top map[string]any) {
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
		// Selected only by the global Service of its name: an entry
		// carrying other labels could join a user's Service (Services
		// select WorkloadEntries) and take its traffic.
		md, _ := top["metadata"].(map[string]any)
		for _, f := range []struct {
			field  string
			labels any
		}{{"metadata.labels", md["labels"]}, {"spec.labels", spec["labels"]}} {
			labels, _ := f.labels.(map[string]any)
			if s, _ := labels[globalServiceLabel].(string); len(labels) != 1 || s == "" {
				m.problems = append(m.problems, fmt.Sprintf("%s must be exactly %s: <service> in a WorkloadEntry the agent writes", f.field, globalServiceLabel))
			}
		}
	case m.gvk.Group == "gateway.networking.k8s.io" && m.gvk.Kind == "Gateway":
		if c, _ := spec["gatewayClassName"].(string); c != remoteGatewayClassName {
			m.problems = append(m.problems, fmt.Sprintf("spec.gatewayClassName %q is not allowed: the agent writes Gateways of class %s only (a remote network's gateway, which deploys nothing)", c, remoteGatewayClassName))
		}
	}
}
