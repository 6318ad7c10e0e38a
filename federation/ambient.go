package federation

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	"github.com/relaymesh/relaymesh/translation"
	"istio.io/api/annotation"
	"istio.io/api/label"
	networkingv1 "istio.io/api/networking/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Ambient federation (docs/design/2026-12-04-ambient-federation.md): an
// ambient Destination of one member reaches the ambient workloads of
// another member on another network through its east-west gateway, over
// double HBONE, with no remote secret. In the consuming member's cluster
// it writes what that cluster's istiod turns into exactly what remote
// secrets would have given its ztunnels: the exporting network's gateway
// (a Gateway of class istio-remote), the service as a global Service of
// the same name and namespace, and one WorkloadEntry on the exporting
// network per ready pod, with the pod's service account. istiod then sends
// ztunnel one workload per (network, service) behind the gateway, never
// the remote pods themselves.

// Names Istio reads (those istio.io/api names, from there).
const (
	apiGateway         = "gateway.networking.k8s.io/v1"
	remoteGatewayClass = "istio-remote"
	// labelGlobal is the label the ambient profile's serviceScopeConfigs
	// make global (a convention, not an istio.io/api name).
	labelGlobal   = "istio.io/global"
	hboneProtocol = "HBONE"
	// LabelGlobalService selects a federated Service's WorkloadEntries:
	// its value is the Service's name (one namespace holds one).
	LabelGlobalService = "relaymesh.io/global-service"
)

var (
	labelNetwork        = label.TopologyNetwork.Name
	annotationGatewaySA = annotation.GatewayServiceAccount.Name
)

// ambientPeer says why mesh to cannot consume from's Destinations over
// ambient federation ("" when it can): both ambient, each on a network of
// its own, from with an east-west gateway with an address on its network,
// and one trust domain (istiod names the remote pods' identities in its
// own trust domain).
func ambientPeer(from, to *member) string {
	fa, ta := from.istio().Ambient, to.istio().Ambient
	switch {
	case fa == nil || ta == nil:
		return "both meshes must be ambient"
	case fa.Network == "" || ta.Network == "":
		return fmt.Sprintf("ambient federation needs each mesh's network (label topology.istio.io/network on istiod's namespace); %s has %q, %s has %q",
			meshName(from.mesh), fa.Network, meshName(to.mesh), ta.Network)
	case fa.Network == ta.Network:
		return fmt.Sprintf("both meshes are on network %q: ambient federation goes through east-west gateways between networks (single-network ambient multicluster needs remote secrets, which Relaymesh does not write)", fa.Network)
	case !fa.MultiNetwork || !ta.MultiNetwork:
		m := from
		if fa.MultiNetwork {
			m = to
		}
		return fmt.Sprintf("istiod of %s does not run with AMBIENT_ENABLE_MULTI_NETWORK=true: it neither sends other networks' services to its ztunnels nor lets its east-west gateway serve them", meshName(m.mesh))
	case !fa.GlobalServiceScope || !ta.GlobalServiceScope:
		m := from
		if fa.GlobalServiceScope {
			m = to
		}
		return fmt.Sprintf("the mesh config of %s has no serviceScopeConfigs entry making Services labelled istio.io/global=true global (the ambient profile's: scope GLOBAL, servicesSelector istio.io/global In [true]): neither the Service Relaymesh writes nor the one it federates would be global there", meshName(m.mesh))
	case len(ambientGateways(fa, "")) == 0:
		return fmt.Sprintf("mesh %s has no east-west gateway on network %q with an address (a Gateway of class istio-east-west with an HBONE listener, programmed)", meshName(from.mesh), fa.Network)
	case len(ambientGateways(fa, to.root)) == 0:
		return fmt.Sprintf("mesh %s's east-west gateways on network %q are not in namespace %s: istiod in %s names a network gateway's identity by the namespace of the Gateway it reads, which Relaymesh writes into %s",
			meshName(from.mesh), fa.Network, to.root, to.cluster, to.root)
	case from.istio().TrustDomain != to.istio().TrustDomain:
		return fmt.Sprintf("istiod in %s names the remote pods by its own trust domain %q (in the service's SANs its ztunnels verify), while they carry %q: every connection would be refused; ambient meshes federate only with one trust domain (spec.mtls.trustDomains: Shared, and the grant shared on both KubernetesClusters)",
			to.cluster, to.istio().TrustDomain, from.istio().TrustDomain)
	}
	return ""
}

// ambientGateways are an ambient mesh's east-west gateways on its own
// network that have an address (in namespace ns, unless ns is ""), sorted
// by namespace/name.
func ambientGateways(a *discoveryv1alpha1.AmbientMesh, ns string) []discoveryv1alpha1.EastWestGatewayInfo {
	var out []discoveryv1alpha1.EastWestGatewayInfo
	for _, g := range a.EastWestGateways {
		if g.Network == a.Network && len(g.Addresses) > 0 && g.HBONEPort > 0 && (ns == "" || g.Namespace == ns) {
			out = append(out, g)
		}
	}
	slices.SortFunc(out, func(x, y discoveryv1alpha1.EastWestGatewayInfo) int {
		return cmp.Or(strings.Compare(x.Namespace, y.Namespace), strings.Compare(x.Name, y.Name))
	})
	return out
}

// ambientOnly says whether m runs only ambient workloads: the sidecar-era
// federated hosts are of no use to it.
func ambientOnly(m *member) bool {
	modes := m.istio().DataPlaneModes
	return m.istio().Ambient != nil && len(modes) == 1 && modes[0] == discoveryv1alpha1.DataPlaneAmbient
}

// exportAmbient federates the ambient Destination d of from to each
// ambient member of to on another network, and returns the notes: an error
// for each member it cannot reach and why, and the members it reached (so
// Finish writes the network gateway there).
func (p *Plan) exportAmbient(s *vmState, out *translation.Output, d *discoveryv1alpha1.Destination, from *member, to []*member) []Note {
	ks := d.Spec.KubeService
	switch {
	case from.istio().Ambient == nil:
		return nil // the sidecar-era export, and the VirtualMesh's warning about ambient clients
	case ks.DataPlaneMode != discoveryv1alpha1.DataPlaneAmbient && ks.DataPlaneMode != discoveryv1alpha1.DataPlaneMixed:
		return nil // its pods run sidecars: likewise
	}
	var notes []Note
	fail := func(m *member, format string, args ...any) {
		notes = append(notes, Note{VirtualMesh: s.key, Mesh: from.key,
			Error: fmt.Sprintf("destination %s not federated to ambient mesh %s: %s", d.Name, m.mesh.Name, fmt.Sprintf(format, args...))})
	}
	var peers []*member
	shared := s.networkClaimedTwice(from)
	for _, m := range to {
		if m.istio().Ambient == nil {
			continue // a sidecar mesh: the sidecar-era export serves it
		}
		why := ambientPeer(from, m)
		if why == "" && shared != "" {
			why = shared
		}
		if why != "" {
			// The same for every Destination of from: said once.
			notes = append(notes, Note{VirtualMesh: s.key, Mesh: from.key,
				Error: fmt.Sprintf("ambient Destinations not federated to ambient mesh %s: %s", m.mesh.Name, why)})
			continue
		}
		peers = append(peers, m)
	}
	if len(peers) == 0 {
		return notes
	}
	failAll := func(format string, args ...any) []Note {
		for _, m := range peers {
			fail(m, format, args...)
		}
		return notes
	}
	if ks.Labels[labelGlobal] != "true" {
		return failAll("its Service %s/%s in %s is not labelled istio.io/global=true: that cluster's east-west gateway forwards only global services (label it there)",
			ks.Ref.Namespace, ks.Ref.Name, ks.Ref.ClusterName)
	}
	ports := servicePorts(d)
	if len(ports) == 0 {
		return failAll("it has no TCP port")
	}
	if len(ks.WorkloadSelectorLabels) == 0 {
		return failAll("it has no pod selector, so its pods' identities are unknown")
	}
	entries, problems := p.ambientEntries(d, from)
	for _, pr := range problems {
		notes = append(notes, Note{VirtualMesh: s.key, Mesh: from.key, Error: fmt.Sprintf("destination %s: %s", d.Name, pr)})
	}
	for _, m := range peers {
		if systemNamespace(ks.Ref.Namespace) || ks.Ref.Namespace == m.root {
			fail(m, "namespace %s is the cluster's or the mesh's own: Relaymesh writes no global Service there", ks.Ref.Namespace)
			continue
		}
		if !p.namespaces[m.cluster+"/"+ks.Ref.Namespace] {
			fail(m, "cluster %s's mesh has no discovered workload or Service in namespace %s: Relaymesh writes global Services only into namespaces the consuming mesh uses", m.cluster, ks.Ref.Namespace)
			continue
		}
		if p.services[m.cluster+"/"+ks.Ref.Namespace+"/"+ks.Ref.Name] {
			fail(m, "cluster %s has a Service %s/%s of its own; Relaymesh writes the global Service only where there is none (a VirtualDestination backed by both joins them, with failover: ambient failover)",
				m.cluster, ks.Ref.Namespace, ks.Ref.Name)
			continue
		}
		add := func(apiVersion, kind, name string, labels, annotations map[string]string, spec any) bool {
			if err := out.AddObjectMeta(m.cluster, apiVersion, kind, ks.Ref.Namespace, name, labels, annotations, spec, s.parent); err != nil {
				fail(m, "%v", err)
				return false
			}
			return true
		}
		// Another member's Service of this name with other ports: its
		// selector would take these entries with the wrong ports.
		if !add("v1", "Service", ks.Ref.Name, map[string]string{labelGlobal: "true"}, nil, globalService(ks.Ref.Name, ports)) {
			continue
		}
		for _, e := range entries {
			if err := out.AddMeta(m.cluster, apiNetworking, "WorkloadEntry", ks.Ref.Namespace, e.name, map[string]string{LabelGlobalService: ks.Ref.Name}, nil, e.spec, s.parent); err != nil {
				fail(m, "%v", err)
			}
		}
		notes = append(notes, Note{VirtualMesh: s.key, Mesh: from.key, AmbientPeer: m.key})
	}
	return notes
}

// networkClaimedTwice says why from's network cannot be trusted to be
// from's ("" when it can): another member reports it too, so a consuming
// istiod would hold two gateways for one network and could send one
// member's traffic to the other's gateway.
func (s *vmState) networkClaimedTwice(from *member) string {
	fa := from.istio().Ambient
	if fa == nil || fa.Network == "" {
		return ""
	}
	var others []string
	for _, m := range s.members {
		if m != from && m.istio().Ambient != nil && m.istio().Ambient.Network == fa.Network {
			others = append(others, meshName(m.mesh))
		}
	}
	if len(others) == 0 {
		return ""
	}
	return fmt.Sprintf("network %q is reported by %s too: a consuming istiod would hold two gateways for one network, so neither is federated until each mesh reports a network of its own", fa.Network, strings.Join(others, ", "))
}

// systemNamespace says whether ns belongs to Kubernetes itself: a remote
// cluster's Service there must not become one here.
func systemNamespace(ns string) bool {
	return ns == "kube-system" || ns == "kube-public" || ns == "kube-node-lease" || ns == "default"
}

// ambientEntry is one of d's ready pods as the consuming cluster holds it.
type ambientEntry struct {
	name string
	spec *networkingv1.WorkloadEntry
}

// ambientEntries are d's ready pods as WorkloadEntries on from's network,
// each with its pod's service account, labelled for the global Service
// Relaymesh writes (see entriesOnNetwork).
func (p *Plan) ambientEntries(d *discoveryv1alpha1.Destination, from *member) ([]ambientEntry, []string) {
	return entriesOnNetwork(p.ids, d, from.istio().Ambient.Network, map[string]string{LabelGlobalService: d.Spec.KubeService.Ref.Name}, "")
}

// entriesOnNetwork are d's ready pods as WorkloadEntries on network, each
// with its pod's service account (the account of the discovered Workload
// whose pod labels the pod carries), the given labels and locality, sorted
// by name. A pod whose IP does not parse, or whose Workload is not
// discovered, is left out and reported: its identity is unknown.
func entriesOnNetwork(ids *identityIndex, d *discoveryv1alpha1.Destination, network string, labels map[string]string, locality string) ([]ambientEntry, []string) {
	ks := d.Spec.KubeService
	var out []ambientEntry
	ips, problems := readyIPs(d)
	workloads := ids.workloads[ks.Ref.ClusterName+"/"+ks.Ref.Namespace]
	for _, e := range ips {
		ip := e.ip
		accounts := map[string]bool{}
		for _, w := range workloads {
			k := w.Spec.Kubernetes
			if labelsMatch(ks.WorkloadSelectorLabels, k.PodLabels) && labelsMatch(k.PodLabels, e.labels) {
				accounts[cmp.Or(k.ServiceAccountName, defaultServiceAccount)] = true
			}
		}
		if len(accounts) != 1 {
			why := "no discovered workload runs the pod"
			if len(accounts) > 1 {
				why = fmt.Sprintf("workloads of different service accounts (%s) match the pod", strings.Join(slices.Sorted(maps.Keys(accounts)), ", "))
			}
			problems = append(problems, fmt.Sprintf("%s at %s: its identity is unknown; it is not federated", why, ip))
			continue
		}
		sa := slices.Collect(maps.Keys(accounts))[0]
		sum := sha256.Sum256([]byte(ks.Ref.ClusterName + "\x00" + ks.Ref.Namespace + "\x00" + ks.Ref.Name + "\x00" + ip))
		out = append(out, ambientEntry{
			// Readable, and unique: the parts alone could repeat across
			// clusters ("a"+"b-c" and "a-b"+"c") or address families.
			name: objectName(ks.Ref.Name, ks.Ref.ClusterName, strings.NewReplacer(".", "-", ":", "-").Replace(ip), hex.EncodeToString(sum[:4])),
			spec: &networkingv1.WorkloadEntry{Address: ip, Network: network, ServiceAccount: sa, Labels: maps.Clone(labels), Locality: locality},
		})
	}
	slices.SortFunc(out, func(a, b ambientEntry) int { return strings.Compare(a.name, b.name) })
	slices.Sort(problems)
	return out, slices.Compact(problems)
}

// globalService is the federated service in a consuming cluster: its
// ports, selecting the service's WorkloadEntries only. istiod makes it
// global by its label istio.io/global (the ambient profile's
// serviceScopeConfigs).
func globalService(name string, ports []servicePort) corev1.ServiceSpec {
	spec := corev1.ServiceSpec{Selector: map[string]string{LabelGlobalService: name}}
	for _, pt := range ports {
		sp := corev1.ServicePort{Name: pt.name, Port: int32(pt.number), Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(int32(cmp.Or(pt.target, pt.number)))}
		if pt.targetName != "" {
			sp.TargetPort = intstr.FromString(pt.targetName)
		}
		if app := appProtocol(pt.protocol); app != "" {
			sp.AppProtocol = &app
		}
		spec.Ports = append(spec.Ports, sp)
	}
	return spec
}

// appProtocol is the Service appProtocol of an Istio protocol name, "" for
// TCP (Kubernetes' default).
func appProtocol(istio string) string {
	switch istio {
	case "TCP":
		return ""
	case "GRPC":
		return "grpc"
	case "HTTP2":
		return "http2"
	}
	return strings.ToLower(istio)
}

// remoteNetworkGateway is the exporting network's east-west gateway as the
// consuming cluster's istiod reads it: class istio-remote (a Gateway of
// the local cluster counts as a network gateway only in that class), the
// network label, the gateway's pods' account, its addresses, and its
// HBONE port.
func remoteNetworkGateway(gw discoveryv1alpha1.EastWestGatewayInfo) map[string]any {
	var addrs []any
	for _, a := range gw.Addresses {
		t := "Hostname"
		if _, err := netip.ParseAddr(a); err == nil {
			t = "IPAddress"
		}
		addrs = append(addrs, map[string]any{"type": t, "value": a})
	}
	return map[string]any{
		"gatewayClassName": remoteGatewayClass,
		"addresses":        addrs,
		"listeners": []any{map[string]any{
			"name": "cross-network", "port": gw.HBONEPort, "protocol": hboneProtocol,
			"tls": map[string]any{"mode": "Passthrough"},
		}},
	}
}

// remoteNetworkGatewayName names from's gateway gw in a consuming cluster.
func remoteNetworkGatewayName(from *member, gw discoveryv1alpha1.EastWestGatewayInfo) string {
	return objectName("relaymesh", from.cluster, gw.Name)
}

// finishAmbient writes, in each consuming member reached over ambient
// federation, the network gateways of every member it consumes from.
func (s *vmState) finishAmbient(out *translation.Output, peers map[string][]string) {
	for _, from := range s.members {
		for _, key := range peers[from.key] {
			m := s.byKey[key]
			if m == nil {
				continue
			}
			for _, gw := range ambientGateways(from.istio().Ambient, m.root) {
				annotations := map[string]string{}
				if gw.ServiceAccount != "" {
					annotations[annotationGatewaySA] = gw.ServiceAccount
				}
				err := out.AddObjectMeta(m.cluster, apiGateway, "Gateway", m.root, remoteNetworkGatewayName(from, gw),
					map[string]string{labelNetwork: gw.Network}, annotations, remoteNetworkGateway(gw), s.parent)
				if err != nil {
					m.errs = append(m.errs, err.Error())
				}
			}
		}
	}
}
