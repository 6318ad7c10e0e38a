package federation

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/translation"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networkingv1 "istio.io/api/networking/v1"
)

const (
	kindVirtualDestination = "VirtualDestination"
	vdNamePrefix           = "relaymesh-vd"
	// failoverLabelPrefix names the labels that order static failover.
	failoverLabelPrefix = "relaymesh.io/failover-"

	defaultConsecutiveErrors = 10
	defaultInterval          = 5 * time.Second
	defaultBaseEjectionTime  = 120 * time.Second
	defaultMaxEjectionPct    = 100
)

// vdState is one VirtualDestination being translated.
type vdState struct {
	vd      *networkingv1alpha1.VirtualDestination
	key     translation.ObjectKey
	parent  translation.Parent
	meshes  []*member  // target meshes, sorted by key
	backend []*backend // in failover order (static) or Destination order (localized)
	missing []string   // target names of static destinations that do not exist
	// ambient: the backends and targets are ambient meshes, and failover
	// is done by waypoints (vd_ambient.go).
	ambient bool
	// hostnames are the ambient hostnames this VirtualDestination
	// published (vd_ambient.go).
	hostnames []AmbientHostname
	errs      []string
	warns     []string
}

// backend is a Destination backing a VirtualDestination.
type backend struct {
	d        *discoveryv1alpha1.Destination
	cluster  string
	region   string
	port     uint32 // the backing Service's port
	podPort  uint32 // the pods' port behind it (the Service port when unknown)
	suffix   string
	gateways []discoveryv1alpha1.GatewayInfo // usable east-west gateways of its mesh
	root     string                          // its mesh's root namespace
	remote   bool                            // some target mesh is in another cluster
	// flat: its VirtualMesh federates on a flat network, so it is reached
	// at its pods; identities are the SPIFFE IDs they present, podPortName
	// the named container port its Service port targets, if any.
	flat        bool
	identities  []string
	podPortName string
	servicePort bool // its Service has the port (so the pods' port is known)
	errs        []string
}

func (b *backend) target() string {
	return translation.DestinationTarget(b.d)
}

// TranslateVirtualDestinations adds the outputs of every VirtualDestination
// in `in` to out and its status to r. It publishes each valid VirtualDestination's
// hostname in the cluster of every target mesh (spec.virtualMesh's members,
// else spec.meshes), in the mesh's root namespace, as two objects named
// `relaymesh-vd-<name>-<namespace>` (sanitized, at most 63 characters):
//
//   - a ServiceEntry: hosts [spec.hostname], one synthetic address from the
//     federation allocator (240.0.0.0/8; the addresses federated hosts get
//     are reserved first so the two never share one), one port
//     {spec.port.number, lower-case protocol, protocol (default HTTP)},
//     MESH_INTERNAL, resolution DNS, and endpoints: a backing Destination in
//     the same cluster is its Service, `<svc>.<ns>.svc.cluster.local` (which
//     kube-dns resolves) on the backing Service's port (spec.port.targetName
//     looked up on the Destination, else targetNumber, else number); one in
//     another cluster is each usable east-west gateway of its mesh, at the
//     gateway's external address and TLS port. Federated hostnames are not
//     used: Envoy resolves DNS endpoints itself, bypassing Istio's DNS proxy,
//     so `*.global` names would not resolve. Every endpoint's locality is the
//     region of the Destination's mesh (Mesh spec.istio.installation.region);
//     Destinations carry no region or zone, so when the mesh has none the
//     cluster name stands in for the region. No zone is set.
//   - a DestinationRule for spec.hostname: outlierDetection (localized: from
//     spec.localized.outlierDetection; unset fields and static failover use
//     the defaults: 10 consecutive 5xx and gateway errors, 5s interval, 120s
//     base ejection, 100% max ejection, so a whole failed locality can be
//     ejected), loadBalancer.localityLbSetting enabled, and ISTIO_MUTUAL
//     with SNI `outbound_.<port>_._.<name>.<namespace>.vd.<suffix>` (the
//     gateway host, below): an east-west gateway routes on that SNI, and a
//     local backend's sidecar accepts Istio mTLS whatever the SNI.
//
// In every cluster with a backing Destination that a target mesh in another
// cluster reaches, two more objects: a ServiceEntry named like the others in
// the Destination's namespace for the gateway host
// `<name>.<namespace>.vd.<suffix>` on spec.port.number (target port: the
// pods' port behind the backing Service port), selecting the Destination's
// pods, exported only to the gateways' namespaces; and the AUTO_PASSTHROUGH
// Gateway for `*.<suffix>` on each usable east-west gateway (the object
// VirtualMesh federation makes; the two merge). The gateway host is not
// spec.hostname because in a cluster that is also a target, spec.hostname
// names every backend, other clusters' gateways included, and a gateway
// would forward there. Such a backing Destination needs a usable east-west
// gateway and a pod selector, all of them one suffix, and a VirtualDestination
// takes at most one Destination per cluster (a gateway routes the gateway host
// to one Service).
//
// Flat network. When every backing Destination belongs to a VirtualMesh
// with federation.flatNetwork, its pods are reached directly and nothing
// involves a gateway: the ServiceEntry, the same in every target cluster,
// has resolution STATIC and as endpoints every backend's ready pods (IP,
// the pods' port behind the backing Service port, the backend's locality
// and, for static failover, its failover labels; an address that is not an
// IP is left out with a warning), and as subjectAltNames the SPIFFE IDs of
// every backend's pods (the Workloads its selector matches, in their mesh's
// trust domain); the DestinationRule sets ISTIO_MUTUAL without SNI; no
// gateway host, ServiceEntry in the backing cluster or Gateway is made. A
// backend is then Invalid without a known identity (fail closed), without a
// Service port of the number used, or when that port targets a named
// container port (the pods' numbers behind names are not discovered).
// Resolution STATIC is what proxyless gRPC clients need: istiod sends them
// every cluster as EDS, and a DNS ServiceEntry has no EDS endpoints.
//
// Failover. Localized: Istio's own locality order (same region first) with
// one localityLbSetting.failover {from, to} per failoverDirective. Istio
// fails over between regions only and honours one target region per source
// region (the first entry whose `from` matches wins), so a directive with a
// zone or sub-zone, several `to` localities, `to` equal to `from`, or a
// `from` region repeated is Invalid instead of being cut down.
// Static: the order must hold for every client whatever its locality, which
// region failover cannot say. It is expressed with failoverPriority labels:
// for N backing Destinations, labels `relaymesh.io/failover-<k>: "true"` for
// k = 1..N-1 are put on the endpoints, the i-th Destination (1-based) carrying
// labels 1..N-i, and failoverPriority lists `relaymesh.io/failover-<k>=true`
// in order. Istio gives an endpoint matching the first j labels priority
// N-1-j, so the i-th Destination gets priority i-1: Envoy sends all traffic to
// the first healthy one in the list.
//
// Validation (each problem makes the VirtualDestination Invalid, with a
// message, and it then produces nothing): exactly one of static or
// localized; exactly one of virtualMesh or meshes, and what they name must
// exist and be Istio meshes with an installation cluster and namespace;
// static destinations must exist and be listed once; localized selectors must
// match at least one Destination and at most one per cluster; with a
// virtualMesh, every backing Destination's mesh must be a member of it (else
// its federated hostname would not exist); spec.port.targetName must name a
// port of every backing Destination; a hostname may be published by one
// VirtualDestination only: the later one (by creation time, then
// namespace/name) is Invalid and names the earlier. Every backing Destination
// is a target in the report, named `<svc>-<ns>-<cluster>` of its Service.
//
// Ambient meshes. When every backend and every target mesh is ambient,
// none of the above is written: failover is done by the waypoint of each
// target cluster's own Service (vd_ambient.go,
// docs/design/2026-12-04-ambient-failover.md).
//
// Reaching a federated endpoint needs its federated hostname to resolve in
// Envoy's DNS (Envoy's own queries bypass Istio's DNS proxy), and the
// VirtualMesh to federate the Destination to the target mesh; neither is
// checked here.
func TranslateVirtualDestinations(in *translation.Input, out *translation.Output, r *translation.Report) {
	TranslateVirtualDestinationsHostnames(in, out, r)
}

// TranslateVirtualDestinationsHostnames is TranslateVirtualDestinations,
// and returns the hostnames valid VirtualDestinations published for
// ambient failover: each needs the access rules of its backend's waypoint
// (policy.TranslateHostnameAccess), which apply to the Service's waypoint
// chain, not to the hostname's.
func TranslateVirtualDestinationsHostnames(in *translation.Input, out *translation.Output, r *translation.Report) []AmbientHostname {
	var hostnames []AmbientHostname
	vds := make([]*vdState, 0, len(in.VirtualDestinations))
	for i := range in.VirtualDestinations {
		vd := &in.VirtualDestinations[i]
		vds = append(vds, &vdState{
			vd:     vd,
			key:    translation.ObjectKey{Kind: kindVirtualDestination, Namespace: vd.Namespace, Name: vd.Name},
			parent: translation.Parent{Kind: kindVirtualDestination, Namespace: vd.Namespace, Name: vd.Name},
		})
	}
	// Earlier VirtualDestinations claim their hostnames first.
	slices.SortFunc(vds, func(a, b *vdState) int {
		if c := a.vd.CreationTimestamp.Compare(b.vd.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Or(strings.Compare(a.vd.Namespace, b.vd.Namespace), strings.Compare(a.vd.Name, b.vd.Name))
	})
	dests := translation.SortedDestinations(in.Destinations)
	vms := sortedVirtualMeshes(in)
	claimed := map[string]*vdState{}
	ids := newIdentityIndex(in)
	var grants *translation.Grants
	if len(vds) > 0 {
		grants = translation.NewGrants(in.Clusters)
	}
	for _, s := range vds {
		s.validate(in, dests, vms, ids, grants)
		if len(s.errs) > 0 {
			continue
		}
		if other := claimed[s.vd.Spec.Hostname]; other != nil {
			s.errs = append(s.errs, fmt.Sprintf("hostname %s is already published by VirtualDestination %s/%s, created earlier", s.vd.Spec.Hostname, other.vd.Namespace, other.vd.Name))
			continue
		}
		claimed[s.vd.Spec.Hostname] = s
	}

	alloc := reservedAllocator(in, vms, dests)
	slices.SortFunc(vds, func(a, b *vdState) int {
		return cmp.Or(strings.Compare(a.vd.Namespace, b.vd.Namespace), strings.Compare(a.vd.Name, b.vd.Name))
	})
	for _, s := range vds {
		gen := s.vd.Generation
		if len(s.errs) == 0 {
			s.translate(in, ids, alloc, out)
		}
		if len(s.errs) > 0 {
			for _, e := range s.errs {
				r.Invalid(s.key, gen, "%s", e)
			}
			s.reportTargets(r, "not translated: the VirtualDestination is invalid")
			continue
		}
		r.Accept(s.key, gen)
		for _, w := range s.warns {
			r.Warn(s.key, gen, "%s", w)
		}
		s.reportTargets(r, "")
		hostnames = append(hostnames, s.hostnames...)
	}
	return hostnames
}

// sortedVirtualMeshes orders VirtualMeshes by namespace/name.
func sortedVirtualMeshes(in *translation.Input) []*networkingv1alpha1.VirtualMesh {
	out := make([]*networkingv1alpha1.VirtualMesh, len(in.VirtualMeshes))
	for i := range in.VirtualMeshes {
		out[i] = &in.VirtualMeshes[i]
	}
	slices.SortFunc(out, func(a, b *networkingv1alpha1.VirtualMesh) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	return out
}

// reservedAllocator returns an allocator in which the federated hostname of
// every Destination of every VirtualMesh member already has its address, in
// the order Translate allocates them, so a VirtualDestination's address never
// equals a federated host's.
func reservedAllocator(in *translation.Input, vms []*networkingv1alpha1.VirtualMesh, dests []*discoveryv1alpha1.Destination) *allocator {
	alloc := newAllocator()
	for _, vm := range vms {
		members := memberKeys(in, vm)
		for _, d := range dests {
			if members[destinationMeshKey(d)] {
				alloc.address(translation.FederatedHostname(d, vmSuffix(vm)))
			}
		}
	}
	return alloc
}

// memberKeys are the Mesh object keys (namespace/name) of the meshes vm
// names that exist.
func memberKeys(in *translation.Input, vm *networkingv1alpha1.VirtualMesh) map[string]bool {
	members := map[string]bool{}
	for _, ref := range vm.Spec.Meshes {
		if m, err := in.MeshFor(ref); err == nil {
			members[m.Namespace+"/"+m.Name] = true
		}
	}
	return members
}

func vmSuffix(vm *networkingv1alpha1.VirtualMesh) string {
	if vm != nil && vm.Spec.Federation != nil {
		return cmp.Or(vm.Spec.Federation.HostnameSuffix, DefaultHostnameSuffix)
	}
	return DefaultHostnameSuffix
}

func destinationMeshKey(d *discoveryv1alpha1.Destination) string {
	return cmp.Or(d.Spec.Mesh.Namespace, d.Namespace) + "/" + d.Spec.Mesh.Name
}

func (s *vdState) fail(format string, args ...any) {
	s.errs = append(s.errs, fmt.Sprintf(format, args...))
}

// validate resolves the target meshes and the backing Destinations; every
// problem is recorded in s.errs.
func (s *vdState) validate(in *translation.Input, dests []*discoveryv1alpha1.Destination, vms []*networkingv1alpha1.VirtualMesh, ids *identityIndex, grants *translation.Grants) {
	spec := s.vd.Spec
	if spec.Hostname == "" {
		s.fail("spec.hostname is empty")
	}
	if spec.Port.Number < 1 || spec.Port.Number > 65535 {
		s.fail("spec.port.number %d is not a port (1-65535)", spec.Port.Number)
	}
	switch vdProtocol(spec.Port) {
	case "HTTP", "HTTP2", "GRPC", "HTTPS", "TLS", "TCP":
	default:
		s.fail("spec.port.protocol %q is not one of HTTP, HTTP2, GRPC, HTTPS, TLS, TCP", spec.Port.Protocol)
	}
	vm := s.resolveMeshes(in, vms, grants)
	switch {
	case spec.Static != nil && spec.Localized != nil:
		s.fail("spec.static and spec.localized are both set; set exactly one")
	case spec.Static != nil:
		s.resolveStatic(dests)
	case spec.Localized != nil:
		s.resolveLocalized(dests)
		s.validateLocalized()
	default:
		s.fail("neither spec.static nor spec.localized is set; set exactly one")
	}
	for _, b := range s.backend {
		s.resolveBackend(in, b, vm, vms, ids)
	}
	if len(s.errs) == 0 && s.isAmbient(in) {
		s.validateAmbient(in)
	} else {
		s.checkReachable()
	}
	for _, b := range s.backend {
		for _, e := range b.errs {
			if !slices.Contains(s.errs, e) {
				s.errs = append(s.errs, e)
			}
		}
	}
}

// checkReachable requires, on a flat network, every backend to name the
// identities of its pods and a numeric pod port; else every backend that a
// target mesh in another cluster must reach to have a usable east-west
// gateway and a pod selector, and all of them to share one hostname suffix
// (the gateways route on one SNI, under their AUTO_PASSTHROUGH server's
// `*.<suffix>`).
func (s *vdState) checkReachable() {
	if s.flat() {
		for _, b := range s.backend {
			if len(b.identities) == 0 {
				b.errs = append(b.errs, fmt.Sprintf("destination %s: no discovered workload of it names the identity its pods present, so clients could not verify them", b.target()))
			}
			if !b.servicePort {
				b.errs = append(b.errs, fmt.Sprintf("destination %s has no TCP port %d; on a flat network the pods' port behind it is unknown", b.target(), b.port))
			}
			if b.podPortName != "" {
				b.errs = append(b.errs, fmt.Sprintf("destination %s: its port %d targets the named container port %q; on a flat network the pods' port must be a number (the pods' numbers behind a name are not discovered)", b.target(), b.port, b.podPortName))
			}
		}
		return
	}
	suffixes := map[string]bool{}
	for _, b := range s.backend {
		for _, m := range s.meshes {
			b.remote = b.remote || m.cluster != b.cluster
		}
		if !b.remote {
			continue
		}
		suffixes[b.suffix] = true
		if len(b.gateways) == 0 {
			b.errs = append(b.errs, fmt.Sprintf("destination %s: its mesh has no usable east-west gateway, so meshes in other clusters cannot reach it", b.target()))
		}
		if len(b.d.Spec.KubeService.WorkloadSelectorLabels) == 0 {
			b.errs = append(b.errs, fmt.Sprintf("destination %s has no pod selector, so its east-west gateway cannot reach its pods", b.target()))
		}
	}
	if len(suffixes) > 1 {
		s.fail("the destinations reached through east-west gateways belong to VirtualMeshes with different hostname suffixes (%s); one VirtualDestination needs one", strings.Join(slices.Sorted(maps.Keys(suffixes)), ", "))
	}
}

// flat reports whether every backend is reached at its pods: each belongs
// to a VirtualMesh that federates on a flat network. Then the hostname's
// endpoints are the backends' pod IPs everywhere (resolution STATIC, which
// proxyless gRPC clients can use), and no gateway is involved. A
// VirtualDestination with any backend behind a gateway keeps DNS endpoints.
func (s *vdState) flat() bool {
	for _, b := range s.backend {
		if !b.flat {
			return false
		}
	}
	return len(s.backend) > 0
}

// gatewayHost is the name the east-west gateways know the VirtualDestination
// by: clients send it as SNI, and each backing cluster defines it for its
// own pods only. It is not the hostname itself, which in a cluster that is
// also a target names every backend, gateways included (a gateway would
// forward to other clusters' gateways).
func (s *vdState) gatewayHost() string {
	suffix := DefaultHostnameSuffix
	for _, b := range s.backend {
		if b.remote {
			suffix = b.suffix
			break
		}
	}
	return s.vd.Name + "." + s.vd.Namespace + ".vd." + suffix
}

// resolveMeshes fills s.meshes and returns the named VirtualMesh, if any.
func (s *vdState) resolveMeshes(in *translation.Input, vms []*networkingv1alpha1.VirtualMesh, registered *translation.Grants) *networkingv1alpha1.VirtualMesh {
	spec := s.vd.Spec
	var refs []common.ClusterObjectRef
	var field string
	var vm *networkingv1alpha1.VirtualMesh
	switch {
	case spec.VirtualMesh != nil && len(spec.Meshes) > 0:
		s.fail("spec.virtualMesh and spec.meshes are both set; set one")
		return nil
	case spec.VirtualMesh != nil:
		ns := cmp.Or(spec.VirtualMesh.Namespace, s.vd.Namespace)
		for _, v := range vms {
			if v.Namespace == ns && v.Name == spec.VirtualMesh.Name {
				vm = v
			}
		}
		if vm == nil {
			s.fail("spec.virtualMesh: VirtualMesh %s/%s not found", ns, spec.VirtualMesh.Name)
			return nil
		}
		refs, field = vm.Spec.Meshes, fmt.Sprintf("VirtualMesh %s/%s: spec.meshes", ns, vm.Name)
	case len(spec.Meshes) > 0:
		refs, field = spec.Meshes, "spec.meshes"
	default:
		s.fail("neither spec.virtualMesh nor spec.meshes is set; set one")
		return nil
	}
	seen := map[string]bool{}
	for i, ref := range refs {
		mesh, err := in.MeshFor(ref)
		if err != nil && !registered.Registered(ref.ClusterName) {
			// As in a VirtualMesh: a deregistered cluster takes no part.
			s.warns = append(s.warns, fmt.Sprintf("%s[%d]: cluster %s is not registered: mesh %s gets nothing until it is", field, i, ref.ClusterName, translation.MeshRefString(ref)))
			continue
		}
		if err != nil {
			s.fail("%s[%d]: %v", field, i, err)
			continue
		}
		key := mesh.Namespace + "/" + mesh.Name
		if seen[key] {
			continue
		}
		seen[key] = true
		switch {
		case mesh.Spec.Istio.Installation.Cluster == "" || mesh.Spec.Istio.Installation.Namespace == "":
			s.fail("%s[%d]: mesh %s has no installation cluster or namespace", field, i, translation.MeshRefString(ref))
		default:
			inst := mesh.Spec.Istio.Installation
			s.meshes = append(s.meshes, &member{key: key, mesh: mesh, cluster: inst.Cluster, root: inst.Namespace})
		}
	}
	slices.SortFunc(s.meshes, func(a, b *member) int { return strings.Compare(a.key, b.key) })
	return vm
}

func (s *vdState) resolveStatic(dests []*discoveryv1alpha1.Destination) {
	seen := map[common.ClusterObjectRef]bool{}
	for i, ref := range s.vd.Spec.Static.Destinations {
		name := translation.TargetName(ref)
		if seen[ref] {
			s.fail("spec.static.destinations[%d]: destination %s is listed twice", i, name)
			continue
		}
		seen[ref] = true
		var found *discoveryv1alpha1.Destination
		for _, d := range dests {
			if d.Spec.KubeService.Ref == ref {
				found = d
				break
			}
		}
		if found == nil {
			s.fail("spec.static.destinations[%d]: destination %s not found (no Service %s/%s in cluster %s)", i, name, ref.Namespace, ref.Name, ref.ClusterName)
			s.missing = append(s.missing, name)
			continue
		}
		b := &backend{d: found, cluster: ref.ClusterName}
		for _, prev := range s.backend {
			if prev.cluster == b.cluster {
				msg := fmt.Sprintf("spec.static.destinations[%d]: destination %s is in cluster %s like %s; a VirtualDestination takes at most one destination per cluster (other clusters reach it through that cluster's east-west gateway, which can route the hostname to one Service only)", i, name, b.cluster, prev.target())
				prev.errs = append(prev.errs, msg)
				b.errs = append(b.errs, msg)
			}
		}
		s.backend = append(s.backend, b)
	}
	if len(s.vd.Spec.Static.Destinations) == 0 {
		s.fail("spec.static.destinations is empty")
	}
}

func (s *vdState) resolveLocalized(dests []*discoveryv1alpha1.Destination) {
	sels := s.vd.Spec.Localized.DestinationSelectors
	if len(sels) == 0 {
		s.fail("spec.localized.destinationSelectors is empty")
		return
	}
	byCluster := map[string]*backend{}
	for _, d := range dests { // sorted by cluster
		if !translation.MatchDestination(sels, d) {
			continue
		}
		b := &backend{d: d, cluster: d.Spec.KubeService.Ref.ClusterName}
		if prev := byCluster[b.cluster]; prev != nil {
			msg := fmt.Sprintf("spec.localized.destinationSelectors select destinations %s and %s in cluster %s; localized failover takes at most one per cluster", prev.target(), b.target(), b.cluster)
			prev.errs = append(prev.errs, msg)
			b.errs = append(b.errs, msg)
		} else {
			byCluster[b.cluster] = b
		}
		s.backend = append(s.backend, b)
	}
	if len(s.backend) == 0 {
		s.fail("spec.localized.destinationSelectors select no destination")
	}
}

// validateLocalized checks the failover directives against what Istio's
// locality failover can express.
func (s *vdState) validateLocalized() {
	from := map[string]int{}
	for i, fd := range s.vd.Spec.Localized.FailoverDirectives {
		at := fmt.Sprintf("spec.localized.failoverDirectives[%d]", i)
		localities := append([]networkingv1alpha1.Locality{fd.From}, fd.To...)
		for j, l := range localities {
			where := at + ".from"
			if j > 0 {
				where = fmt.Sprintf("%s.to[%d]", at, j-1)
			}
			if l.Region == "" {
				s.fail("%s: region is empty", where)
			}
			if l.Zone != "" || l.SubZone != "" {
				s.fail("%s: Istio fails over between regions only; zone and subZone are not supported", where)
			}
		}
		if len(fd.To) != 1 {
			s.fail("%s: Istio fails a region over to exactly one other region; to lists %d localities", at, len(fd.To))
		} else if fd.To[0].Region == fd.From.Region {
			s.fail("%s: from and to are the same region %s", at, fd.From.Region)
		}
		if j, ok := from[fd.From.Region]; ok {
			s.fail("%s: region %s already fails over in failoverDirectives[%d]; Istio honours one directive per region", at, fd.From.Region, j)
		} else {
			from[fd.From.Region] = i
		}
	}
	if od := s.vd.Spec.Localized.OutlierDetection; od != nil {
		if od.Interval != nil && od.Interval.Duration < 0 {
			s.fail("spec.localized.outlierDetection.interval is negative")
		}
		if od.BaseEjectionTime != nil && od.BaseEjectionTime.Duration < 0 {
			s.fail("spec.localized.outlierDetection.baseEjectionTime is negative")
		}
		if p := od.MaxEjectionPercent; p != nil && (*p < 0 || *p > 100) {
			s.fail("spec.localized.outlierDetection.maxEjectionPercent %d is not a percentage", *p)
		}
	}
}

// resolveBackend fills b's region, port, hostname suffix and, on a flat
// network, the identities of its pods.
func (s *vdState) resolveBackend(in *translation.Input, b *backend, vm *networkingv1alpha1.VirtualMesh, vms []*networkingv1alpha1.VirtualMesh, ids *identityIndex) {
	meshKey := destinationMeshKey(b.d)
	b.region = b.cluster
	if m := in.MeshOf(common.ObjectRef{Name: b.d.Spec.Mesh.Name, Namespace: cmp.Or(b.d.Spec.Mesh.Namespace, b.d.Namespace)}); m != nil && m.Spec.Istio != nil {
		b.region = cmp.Or(m.Spec.Istio.Installation.Region, b.cluster)
		b.gateways, b.root = usableGateways(m.Spec.Istio), m.Spec.Istio.Installation.Namespace
	}
	if vm != nil {
		if !memberKeys(in, vm)[meshKey] {
			b.errs = append(b.errs, fmt.Sprintf("destination %s: its mesh %s is not a member of VirtualMesh %s/%s, so it has no federated hostname", b.target(), meshKey, vm.Namespace, vm.Name))
		}
		b.suffix = vmSuffix(vm)
		b.flat = flatFederation(vm)
	} else {
		b.suffix = DefaultHostnameSuffix
		for _, v := range vms { // the first VirtualMesh the mesh belongs to
			if memberKeys(in, v)[meshKey] {
				b.suffix, b.flat = vmSuffix(v), flatFederation(v)
				break
			}
		}
	}
	if b.flat {
		var skipped []string
		b.identities, skipped = ids.identities(b.d)
		for _, sk := range skipped {
			s.warns = append(s.warns, fmt.Sprintf("destination %s: %s", b.target(), sk))
		}
	}
	p := s.vd.Spec.Port
	switch {
	case p.TargetName != "":
		for _, sp := range b.d.Spec.KubeService.Ports {
			if sp.Name == p.TargetName {
				b.port = uint32(sp.Port)
			}
		}
		if b.port == 0 {
			b.errs = append(b.errs, fmt.Sprintf("destination %s has no port named %s (spec.port.targetName)", b.target(), p.TargetName))
		}
	case p.TargetNumber > 0:
		b.port = uint32(p.TargetNumber)
	default:
		b.port = uint32(p.Number)
	}
	b.podPort = b.port
	for _, sp := range servicePorts(b.d) {
		if sp.number == b.port && sp.target > 0 {
			b.podPort = sp.target
		}
		if sp.number == b.port {
			b.servicePort = true
			if sp.targetName != "" {
				b.podPortName = sp.targetName
			}
		}
	}
}

func flatFederation(vm *networkingv1alpha1.VirtualMesh) bool {
	return vm.Spec.Federation != nil && vm.Spec.Federation.FlatNetwork
}

// reportTargets records each backing Destination's verdict.
func (s *vdState) reportTargets(r *translation.Report, idle string) {
	for _, b := range s.backend {
		t := common.TargetStatus{Target: b.target(), State: common.StateAccepted, Errors: b.errs}
		if len(b.errs) > 0 {
			t.State = common.StateInvalid
		} else if idle != "" {
			t.State, t.Errors = common.StateInvalid, []string{idle}
		}
		r.Target(s.key, t)
	}
	for _, name := range s.missing {
		r.Target(s.key, common.TargetStatus{Target: name, State: common.StateInvalid, Errors: []string{"destination not found"}})
	}
}

// translate produces the outputs of a valid VirtualDestination.
func (s *vdState) translate(in *translation.Input, ids *identityIndex, alloc *allocator, out *translation.Output) {
	if s.ambient {
		s.translateAmbient(in, ids, alloc, out)
		return
	}
	spec := s.vd.Spec
	name := objectName(vdNamePrefix, s.vd.Name, s.vd.Namespace)
	addr := alloc.address(spec.Hostname)
	gwHost := s.gatewayHost()
	dr := s.destinationRule(gwHost)
	add := func(cluster, kind, namespace, name string, spec proto.Message) {
		if err := out.Add(cluster, apiNetworking, kind, namespace, name, spec, s.parent); err != nil {
			s.errs = append(s.errs, err.Error())
		}
	}
	s.warnAmbientClients(gwHost)
	if s.flat() {
		se := s.flatServiceEntry(addr)
		for _, m := range s.meshes {
			add(m.cluster, "ServiceEntry", m.root, name, se)
			add(m.cluster, "DestinationRule", m.root, name, dr)
		}
		return
	}
	for _, m := range s.meshes {
		add(m.cluster, "ServiceEntry", m.root, name, s.serviceEntry(addr, m.cluster))
		add(m.cluster, "DestinationRule", m.root, name, dr)
	}
	// Each backing cluster that others reach through its east-west gateway
	// defines the gateway host for its own pods, and opens its gateways to
	// the suffix (the same Gateway VirtualMesh federation makes).
	for _, b := range s.backend {
		if !b.remote {
			continue
		}
		ref := b.d.Spec.KubeService.Ref
		add(b.cluster, "ServiceEntry", ref.Namespace, name, s.gatewayServiceEntry(gwHost, b))
		for _, gw := range b.gateways {
			add(b.cluster, "Gateway", b.root, passthroughGatewayName(gw), passthroughGateway(gw, b.suffix))
		}
	}
}

// warnAmbientClients warns about every client mesh that runs workloads in
// ambient mode: ztunnel reads no DestinationRule, so it neither originates
// the mutual TLS the backends' east-west gateways (or, on a flat network,
// their pods) require nor applies outlier detection and failover priority.
// The mesh's sidecars use the hostname as designed. (A VirtualDestination
// whose backends and targets are all ambient takes the waypoint path
// instead: vd_ambient.go.)
func (s *vdState) warnAmbientClients(gwHost string) {
	reach := "the east-west gateways of its remote backends (" + gwHost + ")"
	if s.flat() {
		reach = "the remote backends' pods"
	}
	for _, m := range s.meshes {
		if !runsAmbient(m.mesh) {
			continue
		}
		s.warns = append(s.warns, fmt.Sprintf("mesh %s runs workloads in ambient mode, for which %s does not work as designed: ztunnel reads no DestinationRule, so it applies neither the mutual TLS %s require nor outlier detection and failover priority; only the mesh's sidecar workloads get failover",
			m.key, s.vd.Spec.Hostname, reach))
	}
}

// gatewayServiceEntry defines the gateway host in b's cluster: b's pods,
// visible to the east-west gateways only.
func (s *vdState) gatewayServiceEntry(host string, b *backend) *networkingv1.ServiceEntry {
	proto := vdProtocol(s.vd.Spec.Port)
	se := &networkingv1.ServiceEntry{
		Hosts:            []string{host},
		Ports:            []*networkingv1.ServicePort{{Number: uint32(s.vd.Spec.Port.Number), Name: strings.ToLower(proto), Protocol: proto, TargetPort: b.podPort}},
		Location:         networkingv1.ServiceEntry_MESH_INTERNAL,
		Resolution:       networkingv1.ServiceEntry_STATIC,
		WorkloadSelector: &networkingv1.WorkloadSelector{Labels: b.d.Spec.KubeService.WorkloadSelectorLabels},
	}
	for _, g := range b.gateways {
		if ns := cmp.Or(g.Namespace, b.root); !slices.Contains(se.ExportTo, ns) {
			se.ExportTo = append(se.ExportTo, ns)
		}
	}
	slices.Sort(se.ExportTo)
	return se
}

func vdProtocol(p networkingv1alpha1.VirtualDestinationPort) string {
	return strings.ToUpper(cmp.Or(p.Protocol, "HTTP"))
}

// hostServiceEntry is the VirtualDestination's hostname, without
// endpoints, and its one port.
func (s *vdState) hostServiceEntry(addr string, resolution networkingv1.ServiceEntry_Resolution) (*networkingv1.ServiceEntry, *networkingv1.ServicePort) {
	spec := s.vd.Spec
	proto := vdProtocol(spec.Port)
	port := &networkingv1.ServicePort{Number: uint32(spec.Port.Number), Name: strings.ToLower(proto), Protocol: proto}
	return &networkingv1.ServiceEntry{
		Hosts:      []string{spec.Hostname},
		Addresses:  []string{addr},
		Ports:      []*networkingv1.ServicePort{port},
		Location:   networkingv1.ServiceEntry_MESH_INTERNAL,
		Resolution: resolution,
	}, port
}

// failoverLabels are the labels of the i-th (0-based) backend's endpoints
// for static failover: of n backends, labels 1..n-1-i; nil for localized
// failover.
func (s *vdState) failoverLabels(i int) map[string]string {
	if s.vd.Spec.Static == nil || i >= len(s.backend)-1 {
		return nil
	}
	labels := map[string]string{}
	for k := 1; k <= len(s.backend)-1-i; k++ {
		labels[failoverLabel(k)] = "true"
	}
	return labels
}

// serviceEntry is the VirtualDestination's hostname in one cluster.
func (s *vdState) serviceEntry(addr, cluster string) *networkingv1.ServiceEntry {
	se, port := s.hostServiceEntry(addr, networkingv1.ServiceEntry_DNS)
	for i, b := range s.backend {
		// Its own cluster reaches a backend by its Service (kube-dns
		// resolves it); other clusters at its east-west gateways.
		var wes []*networkingv1.WorkloadEntry
		if b.cluster == cluster {
			wes = append(wes, &networkingv1.WorkloadEntry{Address: translation.LocalHostname(b.d, ""), Ports: map[string]uint32{port.Name: b.port}})
		} else {
			for _, gw := range b.gateways {
				wes = append(wes, &networkingv1.WorkloadEntry{Address: gw.ExternalAddress, Ports: map[string]uint32{port.Name: uint32(gw.TLSPort)}})
			}
		}
		for _, we := range wes {
			we.Locality, we.Labels = b.region, s.failoverLabels(i)
			se.Endpoints = append(se.Endpoints, we)
		}
	}
	return se
}

// flatServiceEntry is the hostname on a flat network, the same in every
// cluster: every backend's ready pods (on its pods' port, with its region
// as locality and, for static failover, its failover labels), resolution
// STATIC, and the identities of all backends' pods as subjectAltNames.
func (s *vdState) flatServiceEntry(addr string) *networkingv1.ServiceEntry {
	se, port := s.hostServiceEntry(addr, networkingv1.ServiceEntry_STATIC)
	ids := map[string]bool{}
	for i, b := range s.backend {
		for _, id := range b.identities {
			ids[id] = true
		}
		eps, problems := flatEndpoints(b.d, b.region)
		for _, p := range problems {
			s.warns = append(s.warns, fmt.Sprintf("destination %s: %s; left out", b.target(), p))
		}
		for _, we := range eps {
			// Pod labels are not needed on the hostname (it has no
			// subsets); the failover labels are.
			we.Labels = s.failoverLabels(i)
			we.Ports = map[string]uint32{port.Name: b.podPort}
			se.Endpoints = append(se.Endpoints, we)
		}
	}
	se.SubjectAltNames = slices.Sorted(maps.Keys(ids))
	return se
}

func failoverLabel(k int) string { return failoverLabelPrefix + strconv.Itoa(k) }

// destinationRule is the outlier detection and failover of the hostname,
// and Istio mTLS with the gateway host's SNI: an east-west gateway routes on
// it, and a backend's own sidecar accepts mTLS whatever the SNI.
func (s *vdState) destinationRule(gwHost string) *networkingv1.DestinationRule {
	spec := s.vd.Spec
	od := &networkingv1.OutlierDetection{
		Consecutive_5XxErrors:    wrapperspb.UInt32(defaultConsecutiveErrors),
		ConsecutiveGatewayErrors: wrapperspb.UInt32(defaultConsecutiveErrors),
		Interval:                 durationpb.New(defaultInterval),
		BaseEjectionTime:         durationpb.New(defaultBaseEjectionTime),
		MaxEjectionPercent:       defaultMaxEjectionPct,
	}
	lb := &networkingv1.LocalityLoadBalancerSetting{Enabled: wrapperspb.Bool(true)}
	if l := spec.Localized; l != nil {
		if u := l.OutlierDetection; u != nil {
			if u.ConsecutiveErrors > 0 {
				od.Consecutive_5XxErrors = wrapperspb.UInt32(uint32(u.ConsecutiveErrors))
				od.ConsecutiveGatewayErrors = wrapperspb.UInt32(uint32(u.ConsecutiveErrors))
			}
			if u.Interval != nil && u.Interval.Duration > 0 {
				od.Interval = durationpb.New(u.Interval.Duration)
			}
			if u.BaseEjectionTime != nil && u.BaseEjectionTime.Duration > 0 {
				od.BaseEjectionTime = durationpb.New(u.BaseEjectionTime.Duration)
			}
			if u.MaxEjectionPercent != nil {
				od.MaxEjectionPercent = *u.MaxEjectionPercent
			}
		}
		for _, fd := range l.FailoverDirectives {
			lb.Failover = append(lb.Failover, &networkingv1.LocalityLoadBalancerSetting_Failover{From: fd.From.Region, To: fd.To[0].Region})
		}
	} else {
		for k := 1; k < len(s.backend); k++ {
			lb.FailoverPriority = append(lb.FailoverPriority, failoverLabel(k)+"=true")
		}
	}
	tls := &networkingv1.ClientTLSSettings{Mode: networkingv1.ClientTLSSettings_ISTIO_MUTUAL}
	if !s.flat() {
		tls.Sni = fmt.Sprintf("outbound_.%d_._.%s", spec.Port.Number, gwHost)
	}
	return &networkingv1.DestinationRule{
		Host: spec.Hostname,
		TrafficPolicy: &networkingv1.TrafficPolicy{
			OutlierDetection: od,
			LoadBalancer:     &networkingv1.LoadBalancerSettings{LocalityLbSetting: lb},
			Tls:              tls,
		},
	}
}
