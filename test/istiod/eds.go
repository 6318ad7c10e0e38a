package istiod

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
)

// EndpointPriorities renders a ClusterLoadAssignment as its endpoints by priority
// (see hboneEndpoint; an endpoint with a socket address as ip:port); an
// endpoint that is not healthy carries its status in parentheses.
func EndpointPriorities(r *anypb.Any) (map[uint32][]string, error) {
	if r == nil {
		return nil, fmt.Errorf("not sent")
	}
	cla := &endpointv3.ClusterLoadAssignment{}
	if err := r.UnmarshalTo(cla); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	out := map[uint32][]string{}
	for _, group := range cla.GetEndpoints() {
		for _, lb := range group.GetLbEndpoints() {
			ep := lb.GetEndpoint()
			var s string
			if sa := ep.GetAddress().GetSocketAddress(); sa != nil {
				s = fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue())
			} else {
				// Where a remote network's endpoint leads is in its
				// metadata (the tunnel's destination): name the gateway if
				// its address is there.
				s = hboneEndpoint(lb)
			}
			if h := lb.GetHealthStatus(); h != corev3.HealthStatus_UNKNOWN && h != corev3.HealthStatus_HEALTHY {
				s += " (" + h.String() + ")"
			}
			out[group.GetPriority()] = append(out[group.GetPriority()], s)
		}
	}
	for p := range out {
		slices.Sort(out[p])
		out[p] = slices.Compact(out[p])
	}
	return out, nil
}

// SamePriorities says whether a and b hold the same endpoints at the same
// priorities.
func SamePriorities(a, b map[uint32][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for p, eps := range a {
		if !slices.Equal(eps, b[p]) {
			return false
		}
	}
	return true
}

// hboneEndpoint renders an endpoint a waypoint reaches over HBONE, through
// one of Envoy's internal listeners, from its metadata: a pod of the
// waypoint's network (listener connect_originate) as "pod <ip:port>"; an
// endpoint of another network (inner_connect_originate: double HBONE) as
// "gateway <gateway address> for <inner authority>".
func hboneEndpoint(lb *endpointv3.LbEndpoint) string {
	listener := lb.GetEndpoint().GetAddress().GetEnvoyInternalAddress().GetServerListenerName()
	fm := lb.GetMetadata().GetFilterMetadata()
	dst := fm["envoy.filters.listener.original_dst"].GetFields()["local"].GetStringValue()
	switch listener {
	case "connect_originate":
		return "pod " + dst
	case "inner_connect_originate":
		inner := fm["istio"].GetFields()["double_hbone"].GetStructValue().GetFields()["hbone_target_address"].GetStringValue()
		return "gateway " + dst + " for " + inner
	}
	return "internal " + listener + " " + protojson.Format(lb.GetMetadata())
}

// PriorityLoad is the percentage of requests Envoy sends to each priority
// of a cluster, from its endpoints' health (Envoy's priority load with the
// default overprovisioning factor 1.4: a priority takes min(what is left,
// 140 x its healthy share), in priority order). It is exact for the
// clusters here, where every priority is either wholly healthy or wholly
// not, and no healthy priority is left over.
func PriorityLoad(prios map[uint32][]string) map[uint32]int {
	out := map[uint32]int{}
	left := 100.0
	for _, p := range slices.Sorted(maps.Keys(prios)) {
		healthy := 0
		for _, e := range prios[p] {
			if !strings.HasSuffix(e, ")") {
				healthy++
			}
		}
		l := min(left, 140*float64(healthy)/float64(len(prios[p])))
		out[p] = int(l)
		left -= l
	}
	return out
}
