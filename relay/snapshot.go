package relay

import (
	"errors"
	"fmt"
	"github.com/relaymesh/relaymesh/internal/text"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/snapshothash"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Snapshot sizes, the one place they are set: the defaults of
// SnapshotLimits (what a server accepts unless configured otherwise, and
// so the most an agent sends), and the bounds of the parts of a chunked
// push (see relay.proto).
const (
	// DefaultMaxSnapshotBytes: a snapshot pushed whole (Push), one gRPC
	// message.
	DefaultMaxSnapshotBytes = 4 << 20
	// DefaultMaxChunkedSnapshotBytes: a snapshot pushed in parts
	// (PushChunked), all parts together.
	DefaultMaxChunkedSnapshotBytes = 64 << 20
	// MaxSnapshotPartBytes and, but for the last part,
	// MinSnapshotPartBytes bound every part of a chunked push.
	MaxSnapshotPartBytes = 1 << 20
	MinSnapshotPartBytes = 64 << 10
)

// SnapshotLimits bound what one agent may push.
type SnapshotLimits struct {
	// MaxBytes of a snapshot pushed whole (Push): one gRPC message; default
	// 4 MiB. The authenticated server's message limit is at least this.
	MaxBytes int
	// MaxChunkedBytes of a snapshot pushed in parts (PushChunked), all parts
	// together; default 64 MiB (a cluster of 100,000 pods and 10,000
	// Services is about 20 MiB).
	MaxChunkedBytes int
	// MaxObjects is meshes + workloads + destinations; default 50,000.
	MaxObjects int
	// MaxEndpoints per destination; default 10,000.
	MaxEndpoints int
	// MaxLabels per label map; default 64. MaxPorts per destination, and
	// gateways per mesh; default 64.
	MaxLabels, MaxPorts int
	// MaxSubsets: label keys that tell a destination's workloads apart;
	// default 16. MaxSubsetValues per key; default 64.
	MaxSubsets, MaxSubsetValues int
	// MaxExternalAddresses per destination; default 16.
	MaxExternalAddresses int
	// MaxWaypoints per mesh; default 1024 (the Mesh CRD's bound).
	MaxWaypoints int
}

// WithDefaults fills the zero fields of l with their defaults.
func (l SnapshotLimits) WithDefaults() SnapshotLimits {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&l.MaxBytes, DefaultMaxSnapshotBytes)
	def(&l.MaxChunkedBytes, DefaultMaxChunkedSnapshotBytes)
	def(&l.MaxObjects, 50000)
	def(&l.MaxEndpoints, 10000)
	def(&l.MaxLabels, 64)
	def(&l.MaxPorts, 64)
	def(&l.MaxSubsets, 16)
	def(&l.MaxSubsetValues, 64)
	def(&l.MaxExternalAddresses, 16)
	def(&l.MaxWaypoints, 1024)
	return l
}

// ErrSnapshotRefused wraps every reason a snapshot is refused.
var ErrSnapshotRefused = errors.New("snapshot refused")

// Bounds of free-form fields, beyond what Kubernetes' own syntax bounds.
const (
	// maxVersionLen: an image tag is at most 128 characters.
	maxVersionLen = 128
	// maxTrustDomainLen: SPIFFE bounds a trust domain to 255 bytes.
	maxTrustDomainLen = 255
)

// ValidateSnapshot checks a snapshot pushed by cluster's agent against what
// Kubernetes itself allows of the objects it describes, so nothing accepted
// fails to become a discovered object: every object belongs to cluster;
// names, namespaces and label maps have Kubernetes syntax; ports are
// 1-65535 with a known protocol; service types, gateway kinds, workload
// kinds are from their enums; trust domains are SPIFFE trust domains;
// addresses are IPs or DNS names; versions are image-tag characters; every
// workload and destination names a mesh of the snapshot; nothing is
// duplicated; sizes and counts are within limits; the hash matches the
// content. It reports the first problem with its field path; a refused
// snapshot never replaces the last good one.
func ValidateSnapshot(cluster string, s *relaypb.Snapshot, limits SnapshotLimits) error {
	l := limits.WithDefaults()
	if s == nil {
		return refused("empty message")
	}
	if n := proto.Size(s); n > l.MaxBytes {
		return refused("%d bytes, at most %d", n, l.MaxBytes)
	}
	return validateSnapshot(cluster, s, l, snapshothash.Of)
}

// ValidateAssembled runs ValidateSnapshot's checks but for the encoded size
// on a snapshot assembled from parts (Assembler): hash, the SHA-256 of the
// bytes it was decoded from, is the hash s must carry.
func ValidateAssembled(cluster string, s *relaypb.Snapshot, limits SnapshotLimits, hash string) error {
	return validateSnapshot(cluster, s, limits.WithDefaults(), func(*relaypb.Snapshot) string { return hash })
}

// validateSnapshot is ValidateSnapshot but for the encoded size, which the
// caller checked; contentHash is the hash s must carry. A snapshot
// assembled from parts (PushChunked) carries the SHA-256 of the bytes it
// was decoded from, which the assembler computed: the same commitment to
// the content that snapshothash.Of is for the agent's deterministic
// encoding, without encoding it again.
func validateSnapshot(cluster string, s *relaypb.Snapshot, l SnapshotLimits, contentHash func(*relaypb.Snapshot) string) error {
	if s.GetCluster() != cluster {
		return refused("cluster %q, but the agent's certificate names %q", text.Truncate(s.GetCluster(), 80), cluster)
	}
	if n := len(s.GetMeshes()) + len(s.GetWorkloads()) + len(s.GetDestinations()); n > l.MaxObjects {
		return refused("%d objects, at most %d", n, l.MaxObjects)
	}
	if want := contentHash(s); s.GetHash() != want {
		return refused("hash %q does not match the content", text.Truncate(s.GetHash(), 80))
	}
	v := &snapshotValidator{cluster: cluster, l: l, seen: map[string]bool{}, meshes: map[string]bool{},
		keys: map[string]bool{}, values: map[string]bool{}}
	for i, m := range s.GetMeshes() {
		v.mesh(fmt.Sprintf("meshes[%d]", i), m)
	}
	for i, w := range s.GetWorkloads() {
		v.workload(fmt.Sprintf("workloads[%d]", i), w)
	}
	for i, d := range s.GetDestinations() {
		v.destination(fmt.Sprintf("destinations[%d]", i), d)
	}
	return v.err
}

func refused(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrSnapshotRefused, fmt.Sprintf(format, args...))
}

// snapshotValidator keeps the first problem found; later checks are no-ops.
type snapshotValidator struct {
	cluster string
	l       SnapshotLimits
	seen    map[string]bool // kind/namespace/name of every object
	meshes  map[string]bool // namespace/name of every mesh
	// keys and values are label keys and values found valid: a large
	// cluster repeats a few of them on every pod.
	keys, values map[string]bool
	err          error
}

func (v *snapshotValidator) fail(path, format string, args ...any) {
	if v.err == nil {
		v.err = refused("%s: %s", path, fmt.Sprintf(format, args...))
	}
}

// object checks what every object has: its cluster, name and namespace,
// and that it appears once.
func (v *snapshotValidator) object(path, kind, name, namespace, objCluster string) {
	if objCluster != v.cluster {
		v.fail(path+".cluster", "%q is not the agent's cluster %q", text.Truncate(objCluster, 80), v.cluster)
	}
	v.subdomain(path+".name", name)
	v.label(path+".namespace", namespace)
	key := kind + "/" + namespace + "/" + name
	if v.seen[key] {
		v.fail(path, "%s/%s appears twice", text.Truncate(namespace, 80), text.Truncate(name, 80))
	}
	v.seen[key] = true
}

func (v *snapshotValidator) subdomain(path, s string) {
	if errs := validation.IsDNS1123Subdomain(s); len(errs) > 0 {
		v.fail(path, "%q: %s", text.Truncate(s, 80), errs[0])
	}
}

func (v *snapshotValidator) label(path, s string) {
	if errs := validation.IsDNS1123Label(s); len(errs) > 0 {
		v.fail(path, "%q: %s", text.Truncate(s, 80), errs[0])
	}
}

// optional checks s with check unless it is empty.
func (v *snapshotValidator) optional(path, s string, check func(path, s string)) {
	if s != "" {
		check(path, s)
	}
}

// labelsValid reports whether m passes labels, quickly for keys and values
// seen before; it records nothing.
func (v *snapshotValidator) labelsValid(m map[string]string) bool {
	if len(m) > v.l.MaxLabels {
		return false
	}
	for k, val := range m {
		if !v.keys[k] {
			if len(validation.IsQualifiedName(k)) > 0 {
				return false
			}
			v.keys[k] = true
		}
		if !v.values[val] {
			if len(validation.IsValidLabelValue(val)) > 0 {
				return false
			}
			v.values[val] = true
		}
	}
	return true
}

// labels checks a label map: bounded, with qualified-name keys and label
// values; it reports the first problem in key order.
func (v *snapshotValidator) labels(path string, m map[string]string) {
	if v.labelsValid(m) {
		return
	}
	if len(m) > v.l.MaxLabels {
		v.fail(path, "%d labels, at most %d", len(m), v.l.MaxLabels)
		return
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			v.fail(path, "label key %q: %s", text.Truncate(k, 80), errs[0])
		}
		if errs := validation.IsValidLabelValue(m[k]); len(errs) > 0 {
			v.fail(path+"["+text.Truncate(k, 80)+"]", "label value %q: %s", text.Truncate(m[k], 80), errs[0])
		}
	}
}

// meshRef checks a workload's or destination's mesh: one of the snapshot's.
func (v *snapshotValidator) meshRef(path, name, namespace string) {
	if !v.meshes[namespace+"/"+name] {
		v.fail(path, "mesh %s/%s is not a mesh of this snapshot", text.Truncate(namespace, 80), text.Truncate(name, 80))
	}
}

func (v *snapshotValidator) port(path string, p int32, optional bool) {
	if optional && p == 0 {
		return
	}
	if p < 1 || p > 65535 {
		v.fail(path, "%d is not a port (1-65535)", p)
	}
}

// address is an IP address or a DNS name.
func (v *snapshotValidator) address(path, s string) {
	if _, err := netip.ParseAddr(s); err == nil {
		return
	}
	if errs := validation.IsDNS1123Subdomain(s); len(errs) > 0 {
		v.fail(path, "%q is neither an IP address nor a DNS name", text.Truncate(s, 80))
	}
}

func (v *snapshotValidator) mesh(path string, m *relaypb.Mesh) {
	v.object(path, "mesh", m.GetName(), m.GetNamespace(), m.GetCluster())
	v.meshes[m.GetNamespace()+"/"+m.GetName()] = true
	if errs := validation.IsValidLabelValue(m.GetRevision()); len(errs) > 0 {
		v.fail(path+".revision", "%q: %s", text.Truncate(m.GetRevision(), 80), errs[0])
	}
	if s := m.GetVersion(); len(s) > maxVersionLen || strings.TrimLeft(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-+") != "" {
		v.fail(path+".version", "%q is not an image tag (at most %d letters, digits, '.', '_', '-', '+')", text.Truncate(s, 80), maxVersionLen)
	}
	if err := CheckTrustDomain(m.GetTrustDomain()); err != nil {
		v.fail(path+".trustDomain", "%v", err)
	}
	v.optional(path+".istiodServiceAccount", m.GetIstiodServiceAccount(), v.subdomain)
	v.labels(path+".podLabels", m.GetPodLabels())
	if len(m.GetGateways()) > v.l.MaxPorts {
		v.fail(path+".gateways", "%d gateways, at most %d", len(m.GetGateways()), v.l.MaxPorts)
		return
	}
	gateways := map[string]bool{}
	for j, g := range m.GetGateways() {
		gp := fmt.Sprintf("%s.gateways[%d]", path, j)
		v.label(gp+".name", g.GetName())
		v.label(gp+".namespace", g.GetNamespace())
		if key := g.GetNamespace() + "/" + g.GetName(); gateways[key] {
			v.fail(gp, "%s appears twice", key)
		} else {
			gateways[key] = true
		}
		if k := g.GetKind(); k != "Ingress" && k != "EastWest" {
			v.fail(gp+".kind", "%q is not Ingress or EastWest", text.Truncate(k, 40))
		}
		v.labels(gp+".workloadLabels", g.GetWorkloadLabels())
		v.optional(gp+".externalAddress", g.GetExternalAddress(), v.address)
		v.port(gp+".tlsPort", g.GetTlsPort(), true)
	}
	v.waypoints(path, m)
}

// Enums of the ambient data plane.
var (
	waypointTrafficTypes = []string{"service", "workload", "all", "none"}
	dataPlaneModes       = []string{"", "ambient"}
	destinationModes     = []string{"", "ambient", "mixed"}
)

func (v *snapshotValidator) waypoints(path string, m *relaypb.Mesh) {
	wps := m.GetWaypoints()
	if len(wps) > 0 && !m.GetAmbient() {
		v.fail(path+".waypoints", "a mesh without ambient has no waypoints")
	}
	if len(wps) > v.l.MaxWaypoints {
		v.fail(path+".waypoints", "%d waypoints, at most %d", len(wps), v.l.MaxWaypoints)
		return
	}
	seen := map[string]bool{}
	for j, w := range wps {
		wp := fmt.Sprintf("%s.waypoints[%d]", path, j)
		v.subdomain(wp+".name", w.GetName())
		v.label(wp+".namespace", w.GetNamespace())
		if key := w.GetNamespace() + "/" + w.GetName(); seen[key] {
			v.fail(wp, "%s appears twice", text.Truncate(key, 160))
		} else {
			seen[key] = true
		}
		if !slices.Contains(waypointTrafficTypes, w.GetTrafficType()) {
			v.fail(wp+".trafficType", "%q is not service, workload, all or none", text.Truncate(w.GetTrafficType(), 40))
		}
		v.optional(wp+".serviceAccount", w.GetServiceAccount(), v.subdomain)
	}
	if m.GetZtunnel() && !m.GetAmbient() {
		v.fail(path+".ztunnel", "a mesh without ambient has no ztunnel")
	}
	v.eastWestGateways(path, m)
}

// Bounds of a mesh's ambient east-west gateways (the Mesh CRD's).
const (
	maxEastWestGateways         = 64
	maxEastWestGatewayAddresses = 16
)

// eastWestGateways checks the mesh's network and its ambient east-west
// gateways: label-valued networks, each gateway once, an HBONE port, at
// most 16 addresses, each an IP or a DNS name.
func (v *snapshotValidator) eastWestGateways(path string, m *relaypb.Mesh) {
	if errs := validation.IsValidLabelValue(m.GetNetwork()); len(errs) > 0 {
		v.fail(path+".network", "%q: %s", text.Truncate(m.GetNetwork(), 80), errs[0])
	}
	if (m.GetMultiNetwork() || m.GetGlobalServiceScope()) && !m.GetAmbient() {
		v.fail(path+".multiNetwork", "a mesh without ambient has no ambient multi-network settings")
	}
	gws := m.GetEastWestGateways()
	if len(gws) > 0 && !m.GetAmbient() {
		v.fail(path+".eastWestGateways", "a mesh without ambient has no ambient east-west gateways")
	}
	if len(gws) > maxEastWestGateways {
		v.fail(path+".eastWestGateways", "%d east-west gateways, at most %d", len(gws), maxEastWestGateways)
		return
	}
	seen := map[string]bool{}
	for j, g := range gws {
		gp := fmt.Sprintf("%s.eastWestGateways[%d]", path, j)
		v.subdomain(gp+".name", g.GetName())
		v.label(gp+".namespace", g.GetNamespace())
		if key := g.GetNamespace() + "/" + g.GetName(); seen[key] {
			v.fail(gp, "%s appears twice", text.Truncate(key, 160))
		} else {
			seen[key] = true
		}
		if errs := validation.IsValidLabelValue(g.GetNetwork()); g.GetNetwork() == "" || len(errs) > 0 {
			v.fail(gp+".network", "%q is not a network name (a label value, not empty)", text.Truncate(g.GetNetwork(), 80))
		}
		if len(g.GetAddresses()) > maxEastWestGatewayAddresses {
			v.fail(gp+".addresses", "%d addresses, at most %d", len(g.GetAddresses()), maxEastWestGatewayAddresses)
		} else {
			for k, a := range g.GetAddresses() {
				ap := fmt.Sprintf("%s.addresses[%d]", gp, k)
				v.address(ap, a)
				// Written into other clusters as where their traffic goes:
				// never this host, a link-local or unspecified address.
				if ip, err := netip.ParseAddr(a); err == nil && (ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsMulticast() || ip.IsUnspecified() || ip.Zone() != "") {
					v.fail(ap, "%s is not an address other clusters can reach (loopback, link-local, multicast or unspecified)", ip)
				}
			}
		}
		v.port(gp+".hbonePort", g.GetHbonePort(), false)
		v.optional(gp+".serviceAccount", g.GetServiceAccount(), v.subdomain)
	}
}

// waypointRef checks a binding to a waypoint: nil, or a name and namespace.
func (v *snapshotValidator) waypointRef(path string, r *relaypb.WaypointRef) {
	if r == nil {
		return
	}
	v.subdomain(path+".name", r.GetName())
	v.label(path+".namespace", r.GetNamespace())
}

func (v *snapshotValidator) workload(path string, w *relaypb.Workload) {
	kind, ok := discoveryv1alpha1.WorkloadOrigin(w.GetKind())
	if !ok {
		v.fail(path+".kind", "%q is not Deployment, StatefulSet or DaemonSet", text.Truncate(w.GetKind(), 40))
	}
	v.object(path, kind, w.GetName(), w.GetNamespace(), w.GetCluster())
	v.labels(path+".podLabels", w.GetPodLabels())
	v.optional(path+".serviceAccount", w.GetServiceAccount(), v.subdomain)
	v.meshRef(path+".mesh", w.GetMeshName(), w.GetMeshNamespace())
	if !slices.Contains(dataPlaneModes, w.GetDataPlaneMode()) {
		v.fail(path+".dataPlaneMode", "%q is not empty (sidecar) or ambient", text.Truncate(w.GetDataPlaneMode(), 40))
	}
	if w.GetWaypoint() != nil && w.GetDataPlaneMode() != "ambient" {
		v.fail(path+".waypoint", "only an ambient workload is bound to a waypoint")
	}
	v.waypointRef(path+".waypoint", w.GetWaypoint())
}

// Enums of a Kubernetes Service.
var (
	serviceProtocols = []string{"", "TCP", "UDP", "SCTP"}
	serviceTypes     = []string{"", "ClusterIP", "NodePort", "LoadBalancer", "ExternalName"}
)

func (v *snapshotValidator) destination(path string, d *relaypb.Destination) {
	v.object(path, "destination", d.GetName(), d.GetNamespace(), d.GetCluster())
	// A Service's name is a DNS label (it becomes one of a hostname).
	v.label(path+".name", d.GetName())
	v.labels(path+".selector", d.GetSelector())
	v.labels(path+".labels", d.GetLabels())
	v.meshRef(path+".mesh", d.GetMeshName(), d.GetMeshNamespace())
	v.waypointRef(path+".waypoint", d.GetWaypoint())
	if !slices.Contains(destinationModes, d.GetDataPlaneMode()) {
		v.fail(path+".dataPlaneMode", "%q is not empty (sidecar), ambient or mixed", text.Truncate(d.GetDataPlaneMode(), 40))
	}
	if !slices.Contains(serviceTypes, d.GetServiceType()) {
		v.fail(path+".serviceType", "%q is not ClusterIP, NodePort, LoadBalancer or ExternalName", text.Truncate(d.GetServiceType(), 40))
	}
	if n := len(d.GetExternalAddresses()); n > v.l.MaxExternalAddresses {
		v.fail(path+".externalAddresses", "%d addresses, at most %d", n, v.l.MaxExternalAddresses)
	}
	for j, a := range d.GetExternalAddresses() {
		v.address(fmt.Sprintf("%s.externalAddresses[%d]", path, j), a)
	}
	if len(d.GetPorts()) > v.l.MaxPorts {
		v.fail(path+".ports", "%d ports, at most %d", len(d.GetPorts()), v.l.MaxPorts)
		return
	}
	for j, p := range d.GetPorts() {
		pp := fmt.Sprintf("%s.ports[%d]", path, j)
		v.port(pp+".port", p.GetPort(), false)
		v.optional(pp+".name", p.GetName(), v.label)
		if !slices.Contains(serviceProtocols, p.GetProtocol()) {
			v.fail(pp+".protocol", "%q is not TCP, UDP or SCTP", text.Truncate(p.GetProtocol(), 40))
		}
		if ap := p.GetAppProtocol(); ap != "" {
			if errs := validation.IsQualifiedName(ap); len(errs) > 0 {
				v.fail(pp+".appProtocol", "%q: %s", text.Truncate(ap, 80), errs[0])
			}
		}
		if tp := p.GetTargetPort(); tp != "" {
			if n, err := strconv.Atoi(tp); err == nil {
				v.port(pp+".targetPort", int32(min(max(n, -1), 1<<20)), false)
			} else if errs := validation.IsValidPortName(tp); len(errs) > 0 {
				v.fail(pp+".targetPort", "%q is neither a port number nor a port name: %s", text.Truncate(tp, 80), errs[0])
			}
		}
	}
	if len(d.GetSubsets()) > v.l.MaxSubsets {
		v.fail(path+".subsets", "%d subset keys, at most %d", len(d.GetSubsets()), v.l.MaxSubsets)
		return
	}
	for _, k := range slices.Sorted(maps.Keys(d.GetSubsets())) {
		sp := path + ".subsets[" + text.Truncate(k, 80) + "]"
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			v.fail(sp, "label key %q: %s", text.Truncate(k, 80), errs[0])
		}
		vals := d.GetSubsets()[k].GetValues()
		if len(vals) > v.l.MaxSubsetValues {
			v.fail(sp, "%d values, at most %d", len(vals), v.l.MaxSubsetValues)
		}
		for _, val := range vals {
			if errs := validation.IsValidLabelValue(val); len(errs) > 0 || val == "" {
				v.fail(sp, "label value %q is not a non-empty label value", text.Truncate(val, 80))
			}
		}
	}
	if len(d.GetEndpoints()) > v.l.MaxEndpoints {
		v.fail(path+".endpoints", "%d endpoints, at most %d", len(d.GetEndpoints()), v.l.MaxEndpoints)
		return
	}
	// A destination of a large cluster has thousands of endpoints: their
	// paths are only spelled out for a problem.
	for j, e := range d.GetEndpoints() {
		if _, err := netip.ParseAddr(e.GetIp()); err != nil || strings.Contains(e.GetIp(), "%") {
			v.fail(fmt.Sprintf("%s.endpoints[%d].ip", path, j), "%q is not an IP address", text.Truncate(e.GetIp(), 80))
		}
		if !v.labelsValid(e.GetLabels()) {
			v.labels(fmt.Sprintf("%s.endpoints[%d].labels", path, j), e.GetLabels())
		}
	}
}

// CheckTrustDomain reports why td is not a SPIFFE trust domain a mesh may
// claim: 1 to 255 bytes of lower-case letters, digits, '.', '-' and '_'.
func CheckTrustDomain(td string) error {
	switch {
	case td == "":
		return errors.New("empty: every mesh has a trust domain (Istio's default is cluster.local)")
	case len(td) > maxTrustDomainLen:
		return fmt.Errorf("%d bytes, at most %d", len(td), maxTrustDomainLen)
	case !utf8.ValidString(td):
		return errors.New("not UTF-8")
	}
	for _, c := range []byte(td) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return fmt.Errorf("%q is not a SPIFFE trust domain (lower-case letters, digits, '.', '-' and '_')", text.Truncate(td, 80))
		}
	}
	return nil
}
