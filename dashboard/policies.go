package dashboard

import (
	"fmt"
	"sort"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	"github.com/relaymesh/relaymesh/translation"
)

// Policy is one user object of the Policies page.
type Policy struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	State     string `json:"state"`
	// Stale: the status describes an older generation than the spec.
	Stale    bool     `json:"stale"`
	Errors   []string `json:"errors,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
	// Applied, Pending and Failed list the clusters by the state of the
	// object's outputs there (status.clusters); Counts counts all of them.
	Applied []string `json:"applied,omitempty"`
	Pending []string `json:"pending,omitempty"`
	Failed  []string `json:"failed,omitempty"`
	// ApplyErrors are the failed clusters' errors, "cluster: error".
	ApplyErrors []string             `json:"applyErrors,omitempty"`
	Counts      common.ClusterCounts `json:"counts"`
}

// policies builds the Policies page from the user objects of in: problems
// (Invalid, Failed, stale, warnings) first.
func policies(in *translation.Input) []Policy {
	var out []Policy
	add := func(kind, ns, name string, gen int64, st common.Status) {
		p := Policy{Kind: kind, Namespace: ns, Name: name, State: string(st.State), Errors: st.Errors, Warnings: st.Warnings,
			Stale: st.ObservedGeneration != 0 && gen != 0 && st.ObservedGeneration < gen}
		if p.State == "" {
			p.State = "Pending"
		}
		for _, c := range st.Clusters {
			switch c.State {
			case common.ApplyApplied:
				p.Applied = append(p.Applied, c.Cluster)
			case common.ApplyFailed:
				p.Failed = append(p.Failed, c.Cluster)
				for _, e := range c.Errors {
					p.ApplyErrors = append(p.ApplyErrors, c.Cluster+": "+e)
				}
			default:
				p.Pending = append(p.Pending, c.Cluster)
			}
		}
		if st.ClusterCounts != nil {
			p.Counts = *st.ClusterCounts
		} else {
			p.Counts = common.ClusterCounts{Total: int32(len(st.Clusters)), Applied: int32(len(p.Applied)), Pending: int32(len(p.Pending)), Failed: int32(len(p.Failed))}
		}
		out = append(out, p)
	}
	for _, o := range in.VirtualMeshes {
		add("VirtualMesh", o.Namespace, o.Name, o.Generation, o.Status.Status)
	}
	for _, o := range in.TrafficPolicies {
		add("TrafficPolicy", o.Namespace, o.Name, o.Generation, o.Status.Status)
	}
	for _, o := range in.AccessPolicies {
		add("AccessPolicy", o.Namespace, o.Name, o.Generation, o.Status.Status)
	}
	for _, o := range in.VirtualDestinations {
		add("VirtualDestination", o.Namespace, o.Name, o.Generation, o.Status.Status)
	}
	rank := func(p Policy) int {
		switch {
		case p.State == "Invalid" || p.State == "Failed" || len(p.Failed) > 0:
			return 0
		case p.Stale || p.State == "Pending" || len(p.Warnings) > 0:
			return 1
		}
		return 2
	}
	sort.SliceStable(out, func(i, j int) bool {
		if ri, rj := rank(out[i]), rank(out[j]); ri != rj {
			return ri < rj
		}
		return fmt.Sprint(out[i].Kind, "/", out[i].Namespace, "/", out[i].Name) < fmt.Sprint(out[j].Kind, "/", out[j].Namespace, "/", out[j].Name)
	})
	return out
}
