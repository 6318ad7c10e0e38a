package federation

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	"github.com/relaymesh/relaymesh/translation"
	"google.golang.org/protobuf/proto"
	networkingv1 "istio.io/api/networking/v1"
	securityv1 "istio.io/api/security/v1"
	typev1beta1 "istio.io/api/type/v1beta1"
)

const (
	apiNetworking = "networking.istio.io/v1"
	apiSecurity   = "security.istio.io/v1"
	maxNameLength = 63
)

// add records an output object; a conflict is reported on the member the
// object is produced for.
func (s *vmState) add(out *translation.Output, m *member, cluster, apiVersion, kind, namespace, name string, spec proto.Message) {
	if err := out.Add(cluster, apiVersion, kind, namespace, name, spec, s.parent); err != nil {
		m.errs = append(m.errs, err.Error())
	}
}

// servicePort is a federated port of a Destination.
type servicePort struct {
	name     string
	number   uint32
	protocol string // Istio's protocol name
	target   uint32 // the pods' port, 0 if unknown (named or unset)
	// targetName is the pods' named container port, if the target is a name.
	targetName string
}

// servicePorts returns d's ports Istio can proxy, with Istio protocol names.
func servicePorts(d *discoveryv1alpha1.Destination) []servicePort {
	var out []servicePort
	for _, p := range d.Spec.KubeService.Ports {
		if p.Port <= 0 || p.Port > 65535 {
			continue
		}
		switch strings.ToUpper(p.Protocol) {
		case "UDP", "SCTP":
			continue
		}
		proto := istioProtocol(p)
		sp := servicePort{name: p.Name, number: uint32(p.Port), protocol: proto}
		if sp.name == "" {
			sp.name = strings.ToLower(proto) + "-" + strconv.Itoa(int(p.Port))
		}
		if t, err := strconv.ParseUint(p.TargetPort, 10, 16); err == nil && t > 0 {
			sp.target = uint32(t)
		} else if err != nil && p.TargetPort != "" {
			sp.targetName = p.TargetPort
		}
		out = append(out, sp)
	}
	slices.SortFunc(out, func(a, b servicePort) int { return int(a.number) - int(b.number) })
	return out
}

// istioProtocol maps a Service port to Istio's protocol: the appProtocol if
// it names one, else the port name's prefix, else TCP.
func istioProtocol(p discoveryv1alpha1.ServicePort) string {
	for _, s := range []string{p.AppProtocol, p.Name} {
		s = strings.ToLower(s)
		if strings.HasPrefix(s, "grpc-web") {
			return "HTTP" // gRPC-Web is HTTP/1.1 or HTTP/2 framed requests
		}
		if i := strings.IndexByte(s, '-'); i >= 0 {
			s = s[:i]
		}
		switch s {
		case "http":
			return "HTTP"
		case "http2", "h2c", "kubernetes.io/h2c":
			return "HTTP2"
		case "grpc":
			return "GRPC"
		case "https":
			return "HTTPS"
		case "tls":
			return "TLS"
		case "tcp":
			return "TCP"
		}
	}
	return "TCP"
}

// endpoint is where federated traffic for a Destination is sent.
type endpoint struct {
	address string
	port    int32 // every service port maps here; 0: the service port itself
}

// remoteServiceEntry is the federated host in a consuming mesh.
func remoteServiceEntry(host, address string, ports []servicePort, endpoints []endpoint) *networkingv1.ServiceEntry {
	se := &networkingv1.ServiceEntry{
		Hosts:      []string{host},
		Addresses:  []string{address},
		Location:   networkingv1.ServiceEntry_MESH_INTERNAL,
		Resolution: networkingv1.ServiceEntry_STATIC,
	}
	for _, p := range ports {
		se.Ports = append(se.Ports, &networkingv1.ServicePort{Number: p.number, Name: p.name, Protocol: p.protocol})
	}
	for _, e := range endpoints {
		we := &networkingv1.WorkloadEntry{Address: e.address}
		if e.port > 0 {
			we.Ports = map[string]uint32{}
			for _, p := range ports {
				we.Ports[p.name] = uint32(e.port)
			}
		}
		if _, err := netip.ParseAddr(e.address); err != nil {
			se.Resolution = networkingv1.ServiceEntry_DNS
		}
		se.Endpoints = append(se.Endpoints, we)
	}
	return se
}

// localServiceEntry names the federated host in the exporting cluster, so
// the AUTO_PASSTHROUGH gateway has an Envoy cluster for the SNI the client
// sends; its endpoints are D's pods. It is visible to the gateways only.
func localServiceEntry(host string, d *discoveryv1alpha1.Destination, ports []servicePort, gws []discoveryv1alpha1.GatewayInfo, root string) *networkingv1.ServiceEntry {
	se := &networkingv1.ServiceEntry{
		Hosts:            []string{host},
		Location:         networkingv1.ServiceEntry_MESH_INTERNAL,
		Resolution:       networkingv1.ServiceEntry_STATIC,
		WorkloadSelector: &networkingv1.WorkloadSelector{Labels: d.Spec.KubeService.WorkloadSelectorLabels},
	}
	for _, p := range ports {
		se.Ports = append(se.Ports, &networkingv1.ServicePort{Number: p.number, Name: p.name, Protocol: p.protocol, TargetPort: p.target})
	}
	for _, g := range gws {
		ns := g.Namespace
		if ns == "" {
			ns = root
		}
		if !slices.Contains(se.ExportTo, ns) {
			se.ExportTo = append(se.ExportTo, ns)
		}
	}
	slices.Sort(se.ExportTo)
	return se
}

// mutualTLS is the DestinationRule of a federated host: Istio mTLS with the
// SNI an AUTO_PASSTHROUGH gateway routes on.
func mutualTLS(host string, ports []servicePort) *networkingv1.DestinationRule {
	dr := &networkingv1.DestinationRule{
		Host: host,
		TrafficPolicy: &networkingv1.TrafficPolicy{
			Tls: &networkingv1.ClientTLSSettings{Mode: networkingv1.ClientTLSSettings_ISTIO_MUTUAL},
		},
	}
	for _, p := range ports {
		dr.TrafficPolicy.PortLevelSettings = append(dr.TrafficPolicy.PortLevelSettings, &networkingv1.TrafficPolicy_PortTrafficPolicy{
			Port: &networkingv1.PortSelector{Number: p.number},
			Tls:  &networkingv1.ClientTLSSettings{Mode: networkingv1.ClientTLSSettings_ISTIO_MUTUAL, Sni: fmt.Sprintf("outbound_.%d_._.%s", p.number, host)},
		})
	}
	return dr
}

// passthroughGateway opens an east-west gateway's TLS port to federated hosts.
func passthroughGateway(gw discoveryv1alpha1.GatewayInfo, suffix string) *networkingv1.Gateway {
	return &networkingv1.Gateway{
		Selector: gw.WorkloadLabels,
		Servers: []*networkingv1.Server{{
			Port:  &networkingv1.Port{Number: uint32(gw.TLSPort), Name: tlsPortName, Protocol: "TLS"},
			Hosts: []string{"*." + suffix},
			Tls:   &networkingv1.ServerTLSSettings{Mode: networkingv1.ServerTLSSettings_AUTO_PASSTHROUGH},
		}},
	}
}

func strictPeerAuthentication() *securityv1.PeerAuthentication {
	return &securityv1.PeerAuthentication{Mtls: &securityv1.PeerAuthentication_MutualTLS{Mode: securityv1.PeerAuthentication_MutualTLS_STRICT}}
}

// denyAll is an ALLOW AuthorizationPolicy whose one rule no request can
// match (a peer principal that is both present and absent): in the root
// namespace it denies every request in the mesh that no other ALLOW policy
// allows. An empty spec means the same to Envoy, but istiod's grpc
// generator builds no RBAC filter from a policy without rules, so for
// proxyless gRPC servers it would allow everything; this rule is enforced
// by both, on HTTP and TCP alike (principals are not HTTP-only).
func denyAll() *securityv1.AuthorizationPolicy {
	return &securityv1.AuthorizationPolicy{
		Action: securityv1.AuthorizationPolicy_ALLOW,
		Rules: []*securityv1.Rule{{From: []*securityv1.Rule_From{{Source: &securityv1.Source{
			Principals: []string{"*"}, NotPrincipals: []string{"*"},
		}}}}},
	}
}

// denyAllAtWaypoints is denyAll for every waypoint of a mesh: in the root
// namespace, targetRefs GatewayClass istio-waypoint is the one target istiod
// binds to every waypoint. A Destination behind a waypoint is then refused
// at the waypoint unless its own AccessPolicies (relaymesh-<svc>.waypoint)
// admit the source, not only at the destination's ztunnel.
func denyAllAtWaypoints() *securityv1.AuthorizationPolicy {
	p := denyAll()
	p.TargetRefs = []*typev1beta1.PolicyTargetReference{{Group: "gateway.networking.k8s.io", Kind: "GatewayClass", Name: "istio-waypoint"}}
	return p
}

// allowGateway lets everything through an east-west gateway.
func allowGateway(gw discoveryv1alpha1.GatewayInfo) *securityv1.AuthorizationPolicy {
	return &securityv1.AuthorizationPolicy{
		Selector: &typev1beta1.WorkloadSelector{MatchLabels: gw.WorkloadLabels},
		Action:   securityv1.AuthorizationPolicy_ALLOW,
		Rules:    []*securityv1.Rule{{}},
	}
}

func passthroughGatewayName(gw discoveryv1alpha1.GatewayInfo) string {
	return objectName("relaymesh-federation", gw.Name, gw.Namespace)
}

func allowGatewayName(gw discoveryv1alpha1.GatewayInfo) string {
	return objectName("relaymesh-allow", gw.Name, gw.Namespace)
}

// objectName joins parts with "-" into a DNS label: lower case, characters
// other than [a-z0-9-] replaced by "-", at most 63 characters (a longer name
// is cut and ends with a hash of the whole).
func objectName(parts ...string) string {
	full := strings.Join(parts, "-")
	b := []byte(strings.ToLower(full))
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			b[i] = '-'
		}
	}
	name := strings.Trim(string(b), "-")
	if len(name) <= maxNameLength {
		return name
	}
	sum := sha256.Sum256([]byte(full))
	h := hex.EncodeToString(sum[:])[:8]
	return strings.TrimRight(name[:maxNameLength-len(h)-1], "-") + "-" + h
}

// allocator gives each federated host a stable synthetic address in
// 240.0.0.0/8, outside 240.240.0.0/16 where Istio auto-allocates. The
// address is a hash of the host; a collision moves the later host (in
// translation order) to the next free address.
type allocator struct {
	byHost map[string]string
	used   map[uint32]bool
}

func newAllocator() *allocator {
	return &allocator{byHost: map[string]string{}, used: map[uint32]bool{}}
}

func (a *allocator) address(host string) string {
	if addr, ok := a.byHost[host]; ok {
		return addr
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(host))
	n := h.Sum32() & 0xFFFFFF
	for a.used[n] || n>>16 == 240 || n&0xFF == 0 || n&0xFF == 0xFF {
		n = (n + 1) & 0xFFFFFF
	}
	a.used[n] = true
	addr := fmt.Sprintf("240.%d.%d.%d", n>>16, (n>>8)&0xFF, n&0xFF)
	a.byHost[host] = addr
	return addr
}
