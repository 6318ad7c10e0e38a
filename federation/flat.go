package federation

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/relaymesh/relaymesh/translation"
	networkingv1 "istio.io/api/networking/v1"
)

// defaultServiceAccount is the account of pods that name none.
const defaultServiceAccount = "default"

// identityIndex finds the identities a Destination's pods run as: the
// service accounts of the discovered Workloads its selector matches, in
// their mesh's trust domain.
type identityIndex struct {
	in        *translation.Input
	workloads map[string][]*discoveryv1alpha1.Workload // by cluster/namespace
}

func newIdentityIndex(in *translation.Input) *identityIndex {
	idx := &identityIndex{in: in, workloads: map[string][]*discoveryv1alpha1.Workload{}}
	for i := range in.Workloads {
		w := &in.Workloads[i]
		c := w.Spec.Kubernetes.Controller
		k := c.ClusterName + "/" + c.Namespace
		idx.workloads[k] = append(idx.workloads[k], w)
	}
	return idx
}

// identities returns the SPIFFE IDs of d's pods, sorted and unique, and
// why some matching workloads could not be named (their mesh or its trust
// domain is unknown). A Destination without a pod selector has none.
func (x *identityIndex) identities(d *discoveryv1alpha1.Destination) (ids, skipped []string) {
	ks := d.Spec.KubeService
	if len(ks.WorkloadSelectorLabels) == 0 {
		return nil, nil
	}
	set := map[string]bool{}
	for _, w := range x.workloads[ks.Ref.ClusterName+"/"+ks.Ref.Namespace] {
		k := w.Spec.Kubernetes
		if !labelsMatch(ks.WorkloadSelectorLabels, k.PodLabels) {
			continue
		}
		mesh := x.in.MeshOf(w.Spec.Mesh)
		if mesh == nil || mesh.Spec.Istio == nil || mesh.Spec.Istio.TrustDomain == "" {
			skipped = append(skipped, fmt.Sprintf("workload %s/%s: its mesh has no known trust domain", k.Controller.Namespace, k.Controller.Name))
			continue
		}
		set[spiffeID(mesh.Spec.Istio.TrustDomain, k.Controller.Namespace, cmp.Or(k.ServiceAccountName, defaultServiceAccount))] = true
	}
	slices.Sort(skipped)
	return slices.Sorted(maps.Keys(set)), slices.Compact(skipped)
}

func spiffeID(trustDomain, namespace, serviceAccount string) string {
	return "spiffe://" + trustDomain + "/ns/" + namespace + "/sa/" + serviceAccount
}

// labelsMatch reports whether every selector label is among labels.
func labelsMatch(selector, labels map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// flatPorts are d's ports with the pods' port as their target: a port
// whose target is a named container port cannot be reached directly
// (Destinations do not carry the pods' numbers for names) and is left out,
// with a problem saying so.
func flatPorts(d *discoveryv1alpha1.Destination) (ports []servicePort, problems []string) {
	for _, p := range servicePorts(d) {
		switch {
		case p.target > 0:
		case p.targetName != "":
			problems = append(problems, fmt.Sprintf("port %s targets the named container port %q; flatNetwork needs a numeric target port, the pods' port numbers behind a name are not discovered", p.name, p.targetName))
			continue
		default:
			p.target = p.number // Kubernetes' default: the Service port
		}
		ports = append(ports, p)
	}
	return ports, problems
}

// flatEndpoints are d's ready endpoints as ServiceEntry endpoints, sorted
// by address: the pod's IP and labels (which subsets select), and locality
// when set. An IP that does not parse is left out, with a problem saying so.
func flatEndpoints(d *discoveryv1alpha1.Destination, locality string) (eps []*networkingv1.WorkloadEntry, problems []string) {
	ips, problems := readyIPs(d)
	for _, e := range ips {
		we := &networkingv1.WorkloadEntry{Address: e.ip, Locality: locality}
		if len(e.labels) > 0 {
			we.Labels = maps.Clone(e.labels)
		}
		eps = append(eps, we)
	}
	slices.SortFunc(eps, func(a, b *networkingv1.WorkloadEntry) int { return strings.Compare(a.Address, b.Address) })
	return eps, problems
}

// readyIP is one of a Destination's ready pods: its IP in canonical form
// and its labels.
type readyIP struct {
	ip     string
	labels map[string]string
}

// readyIPs are d's endpoints with an IP address, each address once, in
// d's order; an address that does not parse (or has a zone) is left out
// with a problem saying so.
func readyIPs(d *discoveryv1alpha1.Destination) (out []readyIP, problems []string) {
	seen := map[string]bool{}
	for _, e := range d.Spec.KubeService.Endpoints {
		addr, err := netip.ParseAddr(e.IP)
		if err != nil || addr.Zone() != "" {
			problems = append(problems, fmt.Sprintf("endpoint %q is not an IP address", text.Truncate(e.IP, 64)))
			continue
		}
		if ip := addr.String(); !seen[ip] {
			seen[ip] = true
			out = append(out, readyIP{ip: ip, labels: e.Labels})
		}
	}
	return out, problems
}

// flatServiceEntry is a federated host reached at the exporting mesh's pod
// IPs: the Destination's ports, each with the pods' port as target port,
// its ready endpoints, and the identities its pods must present.
func flatServiceEntry(host, address string, ports []servicePort, endpoints []*networkingv1.WorkloadEntry, identities []string) *networkingv1.ServiceEntry {
	se := &networkingv1.ServiceEntry{
		Hosts:           []string{host},
		Addresses:       []string{address},
		Location:        networkingv1.ServiceEntry_MESH_INTERNAL,
		Resolution:      networkingv1.ServiceEntry_STATIC,
		SubjectAltNames: identities,
		Endpoints:       endpoints,
	}
	for _, p := range ports {
		se.Ports = append(se.Ports, &networkingv1.ServicePort{Number: p.number, Name: p.name, Protocol: p.protocol, TargetPort: p.target})
	}
	return se
}

// flatMutualTLS is the DestinationRule of a federated host on a flat
// network: Istio mTLS to the pods themselves. No SNI is set: there is no
// gateway to route on it, and a sidecar (or a proxyless server) accepts
// Istio mTLS whatever the SNI.
func flatMutualTLS(host string) *networkingv1.DestinationRule {
	return &networkingv1.DestinationRule{
		Host: host,
		TrafficPolicy: &networkingv1.TrafficPolicy{
			Tls: &networkingv1.ClientTLSSettings{Mode: networkingv1.ClientTLSSettings_ISTIO_MUTUAL},
		},
	}
}

// exportFlat federates d of mesh from to the meshes to on a flat network:
// in each consuming mesh a ServiceEntry whose endpoints are d's pod IPs,
// naming the identities of d's pods in from's trust domain, and ISTIO_MUTUAL
// for the host. Nothing is needed in from's cluster.
func (s *vmState) exportFlat(out *translation.Output, alloc *allocator, ids *identityIndex, d *discoveryv1alpha1.Destination, from *member, to []*member, suffix string) []Note {
	var notes []Note
	note := func(msg string) { notes = append(notes, Note{VirtualMesh: s.key, Mesh: from.key, Error: msg}) }
	names := make([]string, len(to))
	for i, m := range to {
		names[i] = m.mesh.Name
	}
	prefix := fmt.Sprintf("destination %s not federated to %s: ", d.Name, strings.Join(names, ", "))
	if len(servicePorts(d)) == 0 {
		note(prefix + "it has no TCP port")
		return notes
	}
	ports, problems := flatPorts(d)
	for _, p := range problems {
		note(fmt.Sprintf("destination %s: %s", d.Name, p))
	}
	if len(ports) == 0 {
		note(prefix + "no port can be reached at the pods directly")
		return notes
	}
	identities, skipped := ids.identities(d)
	for _, sk := range skipped {
		note(fmt.Sprintf("destination %s: %s", d.Name, sk))
	}
	if len(identities) == 0 {
		// Without names to verify, a client would accept any certificate
		// of the shared root for this host: refuse rather than fail open.
		note(prefix + "no discovered workload of it names the identity its pods present, so clients could not verify them")
		return notes
	}
	endpoints, problems := flatEndpoints(d, "")
	for _, p := range problems {
		note(fmt.Sprintf("destination %s: %s", d.Name, p))
	}
	host := translation.FederatedHostname(d, suffix)
	addr := alloc.address(host)
	ref := d.Spec.KubeService.Ref
	name := objectName(ref.Name, ref.Namespace, ref.ClusterName)
	for _, m := range to {
		if err := out.Add(m.cluster, apiNetworking, "ServiceEntry", m.root, name, flatServiceEntry(host, addr, ports, endpoints, identities), s.parent); err != nil {
			note(err.Error())
		}
		if err := out.Add(m.cluster, apiNetworking, "DestinationRule", m.root, name, flatMutualTLS(host), s.parent); err != nil {
			note(err.Error())
		}
	}
	return notes
}
