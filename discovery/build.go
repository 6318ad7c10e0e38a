package discovery

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/snapshothash"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Labels, annotations and values discovery reads.
const (
	labelApp             = "app"
	labelIstio           = "istio"
	labelRevision        = "istio.io/rev"
	labelInjection       = "istio-injection"
	labelOperatorVersion = "operator.istio.io/version"
	keyInject            = "sidecar.istio.io/inject" // label or annotation

	valueIstiod           = "istiod"
	valuePilot            = "pilot"
	valueIngressGateway   = "ingressgateway"
	valueEastWestGateway  = "eastwestgateway"
	valueDefaultRevision  = "default"
	valueInjectionEnabled = "enabled"

	gatewayIngress  = "Ingress"
	gatewayEastWest = "EastWest"

	kindDeployment  = "Deployment"
	kindStatefulSet = "StatefulSet"
	kindDaemonSet   = "DaemonSet"

	defaultServiceAccount = "default"
	defaultServiceType    = string(corev1.ServiceTypeClusterIP)
	defaultProtocol       = string(corev1.ProtocolTCP)
	portNameTLS           = "tls"
	portEastWestTLS       = 15443
)

// Inputs are the cluster objects discovery reads.
type Inputs struct {
	Namespaces   []*corev1.Namespace
	Deployments  []*appsv1.Deployment
	StatefulSets []*appsv1.StatefulSet
	DaemonSets   []*appsv1.DaemonSet
	Services     []*corev1.Service
	ConfigMaps   []*corev1.ConfigMap
	Pods         []*corev1.Pod
	// Gateways are gateway.networking.k8s.io/v1 Gateways (waypoints).
	Gateways []*unstructured.Unstructured
}

// Build is the pure heart of discovery: cluster objects in, snapshot out.
// The result is deterministic (see the package doc) and has Hash set. Build
// never mutates in, and the snapshot shares no maps with it.
func Build(cluster string, in Inputs) *relaypb.Snapshot {
	b := &builder{
		cluster:      valid(cluster),
		nsLabels:     map[string]map[string]string{},
		configMaps:   map[nsName]*corev1.ConfigMap{},
		meshByRev:    map[string]*relaypb.Mesh{},
		meshByNs:     map[string][]*relaypb.Mesh{},
		workloadsIdx: map[string]*workloadIndex{},
	}
	// Sorted, so that even duplicate names (impossible in a cluster) give
	// one answer whatever the input order.
	for _, ns := range sortedObjects(in.Namespaces) {
		b.nsLabels[ns.Name] = ns.Labels
	}
	for _, cm := range sortedObjects(in.ConfigMaps) {
		b.configMaps[nsName{cm.Namespace, cm.Name}] = cm
	}
	deployments := sortedObjects(in.Deployments)
	services := sortedObjects(in.Services)

	s := &relaypb.Snapshot{Cluster: b.cluster}
	daemonSets := sortedObjects(in.DaemonSets)
	s.Meshes = b.meshes(deployments)
	b.gateways(services)
	b.ztunnels(daemonSets)
	b.waypoints(sortedObjects(in.Gateways), deployments)
	b.eastWestGateways(sortedObjects(in.Gateways))
	s.Workloads = b.workloads(deployments, sortedObjects(in.StatefulSets), daemonSets)
	b.sortWaypoints()
	s.Destinations = b.destinations(services, sortedObjects(in.Pods))
	s.Hash = snapshothash.Of(s)
	return s
}

type nsName struct{ namespace, name string }

// builder carries the indexes one Build call shares between its steps.
type builder struct {
	cluster    string
	nsLabels   map[string]map[string]string
	configMaps map[nsName]*corev1.ConfigMap

	meshList  []*relaypb.Mesh          // sorted by namespace/name
	meshByRev map[string]*relaypb.Mesh // first by namespace/name per revision
	meshByNs  map[string][]*relaypb.Mesh

	workloadsIdx map[string]*workloadIndex // by namespace
}

// meshes turns istiod Deployments into meshes.
func (b *builder) meshes(deployments []*appsv1.Deployment) []*relaypb.Mesh {
	for _, d := range deployments {
		if !isIstiod(d) {
			continue
		}
		rev, ok := d.Labels[labelRevision]
		if !ok {
			rev = d.Spec.Template.Labels[labelRevision]
		}
		rev = normalizeRevision(rev)
		version := d.Labels[labelOperatorVersion]
		if version == "" && len(d.Spec.Template.Spec.Containers) > 0 {
			version = imageTag(d.Spec.Template.Spec.Containers[0].Image)
		}
		cmName := "istio"
		if rev != "" {
			cmName += "-" + rev
		}
		mc := meshConfig{TrustDomain: defaultTrustDomain}
		if cm := b.configMaps[nsName{d.Namespace, cmName}]; cm != nil {
			mc = parseMeshConfig(cm.Data[meshConfigKey])
		}
		m := &relaypb.Mesh{
			Name:                 valid(d.Name),
			Namespace:            valid(d.Namespace),
			Cluster:              b.cluster,
			Revision:             valid(rev),
			Version:              valid(version),
			TrustDomain:          valid(mc.TrustDomain),
			IstiodServiceAccount: serviceAccount(&d.Spec.Template),
			PodLabels:            copyMap(d.Spec.Template.Labels),
			SmartDnsProxying:     mc.DNSCapture,
			Ambient:              ambientEnabled(d),
		}
		if m.Ambient {
			m.MultiNetwork, m.GlobalServiceScope = envTrue(d, envMultiNetwork), mc.GlobalScope
		}
		b.meshList = append(b.meshList, m)
		b.meshByNs[m.Namespace] = append(b.meshByNs[m.Namespace], m)
		if _, ok := b.meshByRev[rev]; !ok {
			b.meshByRev[rev] = m
		}
	}
	return b.meshList
}

// gateways attaches gateway Services to their meshes.
func (b *builder) gateways(services []*corev1.Service) {
	if len(b.meshList) == 0 {
		return
	}
	for _, svc := range services {
		kind := gatewayKind(svc.Labels)
		if kind == "" {
			continue
		}
		m := b.gatewayMesh(svc)
		if m == nil {
			continue
		}
		g := &relaypb.Gateway{
			Name:           valid(svc.Name),
			Namespace:      valid(svc.Namespace),
			Kind:           kind,
			WorkloadLabels: copyMap(svc.Spec.Selector),
			TlsPort:        gatewayTLSPort(svc),
		}
		if addrs := externalAddresses(svc); len(addrs) > 0 {
			g.ExternalAddress = addrs[0]
		} else if ip := svc.Spec.ClusterIP; ip != corev1.ClusterIPNone {
			g.ExternalAddress = valid(ip)
		}
		m.Gateways = append(m.Gateways, g)
	}
}

// gatewayMesh picks the mesh a gateway Service belongs to (see the package
// doc), or nil.
func (b *builder) gatewayMesh(svc *corev1.Service) *relaypb.Mesh {
	rev, hasRev := svc.Labels[labelRevision]
	rev = normalizeRevision(rev)
	if local := b.meshByNs[svc.Namespace]; len(local) > 0 {
		if hasRev {
			for _, m := range local {
				if m.Revision == rev {
					return m
				}
			}
		}
		for _, m := range local {
			if m.Revision == "" {
				return m
			}
		}
		return local[0]
	}
	if len(b.meshList) == 1 {
		return b.meshList[0]
	}
	if hasRev {
		if m := b.meshByRev[rev]; m != nil {
			return m
		}
	}
	return b.meshByRev[""]
}

// workloads reports the injected Deployments, StatefulSets and DaemonSets
// whose revision has a mesh, and indexes them by namespace.
func (b *builder) workloads(deployments []*appsv1.Deployment, statefulSets []*appsv1.StatefulSet, daemonSets []*appsv1.DaemonSet) []*relaypb.Workload {
	var out []*relaypb.Workload
	add := func(kind string, meta *metav1.ObjectMeta, tmpl *corev1.PodTemplateSpec) {
		if isGateway(meta.Labels) || isGateway(tmpl.Labels) {
			return
		}
		m, mode, ok := b.workloadMode(meta, tmpl)
		if !ok {
			return
		}
		w := &relaypb.Workload{
			Name:           valid(meta.Name),
			Namespace:      valid(meta.Namespace),
			Cluster:        b.cluster,
			Kind:           kind,
			PodLabels:      copyMap(tmpl.Labels),
			ServiceAccount: serviceAccount(tmpl),
			MeshName:       m.Name,
			MeshNamespace:  m.Namespace,
			DataPlaneMode:  mode,
		}
		if mode == discoveryv1alpha1.DataPlaneAmbient {
			w.Waypoint = waypointRef(tmpl.Labels, b.nsLabels[meta.Namespace], w.Namespace)
		}
		out = append(out, w)
	}
	for _, d := range deployments {
		if !isIstiod(d) {
			add(kindDeployment, &d.ObjectMeta, &d.Spec.Template)
		}
	}
	for _, s := range statefulSets {
		add(kindStatefulSet, &s.ObjectMeta, &s.Spec.Template)
	}
	for _, d := range daemonSets {
		add(kindDaemonSet, &d.ObjectMeta, &d.Spec.Template)
	}
	// Stable: names that only repair to equal strings keep the input order,
	// which is sorted.
	slices.SortStableFunc(out, func(a, b *relaypb.Workload) int {
		return cmp.Or(
			strings.Compare(a.Namespace, b.Namespace),
			strings.Compare(a.Name, b.Name),
			strings.Compare(a.Kind, b.Kind),
		)
	})
	// Group by namespace; out is sorted, so each group is contiguous and
	// keeps the sort order.
	for i := 0; i < len(out); {
		j := i
		for j < len(out) && out[j].Namespace == out[i].Namespace {
			j++
		}
		group := out[i:j:j]
		sets := make([]map[string]string, len(group))
		for k, w := range group {
			sets[k] = w.PodLabels
		}
		b.workloadsIdx[out[i].Namespace] = &workloadIndex{workloads: group, labels: newLabelIndex(sets)}
		i = j
	}
	return out
}

type workloadIndex struct {
	workloads []*relaypb.Workload
	labels    *labelIndex
}

// destinations reports the Services that select reported workloads, with
// their ready endpoints.
func (b *builder) destinations(services []*corev1.Service, pods []*corev1.Pod) []*relaypb.Destination {
	podsByNs := map[string][]*corev1.Pod{}
	for _, p := range pods { // sorted, so every group is sorted too
		if podReady(p) {
			podsByNs[p.Namespace] = append(podsByNs[p.Namespace], p)
		}
	}
	podIdx := map[string]*labelIndex{} // built on first use per namespace

	var out []*relaypb.Destination
	for _, svc := range services {
		sel := svc.Spec.Selector
		if len(sel) == 0 || gatewayKind(svc.Labels) != "" {
			continue
		}
		wi := b.workloadsIdx[valid(svc.Namespace)]
		if wi == nil {
			continue
		}
		matched := wi.labels.match(sel)
		if len(matched) == 0 {
			continue
		}
		selected := make([]*relaypb.Workload, len(matched))
		for i, k := range matched {
			selected[i] = wi.workloads[k]
		}
		d := &relaypb.Destination{
			Name:              valid(svc.Name),
			Namespace:         valid(svc.Namespace),
			Cluster:           b.cluster,
			Selector:          copyMap(sel),
			Labels:            copyMap(svc.Labels),
			Ports:             servicePorts(svc.Spec.Ports),
			Subsets:           subsets(selected, sel),
			ServiceType:       valid(cmp.Or(string(svc.Spec.Type), defaultServiceType)),
			ExternalAddresses: externalAddresses(svc),
			MeshName:          selected[0].MeshName,
			MeshNamespace:     selected[0].MeshNamespace,
			Waypoint:          waypointRef(svc.Labels, b.nsLabels[svc.Namespace], valid(svc.Namespace)),
			DataPlaneMode:     destinationMode(selected),
			Headless:          svc.Spec.ClusterIP == corev1.ClusterIPNone,
		}
		nsPods := podsByNs[svc.Namespace]
		if len(nsPods) > 0 {
			idx := podIdx[svc.Namespace]
			if idx == nil {
				sets := make([]map[string]string, len(nsPods))
				for i, p := range nsPods {
					sets[i] = p.Labels
				}
				idx = newLabelIndex(sets)
				podIdx[svc.Namespace] = idx
			}
			var running podModes
			for _, k := range idx.match(sel) {
				p := nsPods[k]
				running.add(p)
				d.Endpoints = append(d.Endpoints, &relaypb.Endpoint{Ip: valid(p.Status.PodIP), Labels: copyMap(p.Labels), Ambient: PodRedirected(p)})
			}
			d.DataPlaneMode = running.mode(d.DataPlaneMode)
			// nsPods is sorted by name, and the sort is stable: equal IPs
			// stay in name order.
			slices.SortStableFunc(d.Endpoints, func(a, b *relaypb.Endpoint) int { return strings.Compare(a.Ip, b.Ip) })
		}
		out = append(out, d)
	}
	return out
}

// isIstiod reports whether a Deployment is an Istio control plane.
func isIstiod(d *appsv1.Deployment) bool {
	return d.Labels[labelApp] == valueIstiod || d.Labels[labelIstio] == valuePilot
}

func gatewayKind(labels map[string]string) string {
	switch labels[labelIstio] {
	case valueIngressGateway:
		return gatewayIngress
	case valueEastWestGateway:
		return gatewayEastWest
	}
	return ""
}

func isGateway(labels map[string]string) bool { return gatewayKind(labels) != "" }

func normalizeRevision(rev string) string {
	if rev == valueDefaultRevision {
		return ""
	}
	return rev
}

// injection decides whether pods of tmpl in a namespace with nsLabels get a
// sidecar, and from which revision (see the package doc).
func injection(nsLabels map[string]string, tmpl *corev1.PodTemplateSpec) (revision string, injected bool) {
	override := tmpl.Labels[keyInject]
	if override != "true" && override != "false" {
		override = tmpl.Annotations[keyInject]
	}
	podRev, hasPodRev := tmpl.Labels[labelRevision]
	nsRev, hasNsRev := nsLabels[labelRevision]
	nsInjection, hasNsInjection := nsLabels[labelInjection]
	switch override {
	case "false":
		return "", false
	case "true":
		switch {
		case hasPodRev:
			return normalizeRevision(podRev), true
		case nsInjection == valueInjectionEnabled:
			return "", true
		case hasNsRev:
			return normalizeRevision(nsRev), true
		}
		return "", true
	}
	switch {
	case hasNsInjection:
		return "", nsInjection == valueInjectionEnabled
	case hasNsRev:
		return normalizeRevision(nsRev), true
	case hasPodRev:
		return normalizeRevision(podRev), true
	}
	return "", false
}

func serviceAccount(tmpl *corev1.PodTemplateSpec) string {
	return valid(cmp.Or(tmpl.Spec.ServiceAccountName, defaultServiceAccount))
}

// imageTag returns the tag of an image reference, "" when it has none.
func imageTag(image string) string {
	if i := strings.IndexByte(image, '@'); i >= 0 {
		image = image[:i]
	}
	colon := strings.LastIndexByte(image, ':')
	if colon > strings.LastIndexByte(image, '/') {
		return image[colon+1:]
	}
	return ""
}

// externalAddresses lists the load balancer ingress addresses (ip, else
// hostname) and then the external IPs of a Service, without duplicates.
func externalAddresses(svc *corev1.Service) []string {
	var out []string
	seen := map[string]bool{}
	add := func(a string) {
		a = valid(a)
		if a != "" && !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		add(cmp.Or(ing.IP, ing.Hostname))
	}
	for _, ip := range svc.Spec.ExternalIPs {
		add(ip)
	}
	return out
}

func gatewayTLSPort(svc *corev1.Service) int32 {
	var fallback int32
	for _, p := range svc.Spec.Ports {
		if p.Name == portNameTLS {
			return p.Port
		}
		if p.Port == portEastWestTLS {
			fallback = portEastWestTLS
		}
	}
	return fallback
}

func servicePorts(ports []corev1.ServicePort) []*relaypb.ServicePort {
	out := make([]*relaypb.ServicePort, 0, len(ports))
	for _, p := range ports {
		sp := &relaypb.ServicePort{
			Port:     p.Port,
			Name:     valid(p.Name),
			Protocol: valid(cmp.Or(string(p.Protocol), defaultProtocol)),
		}
		if p.AppProtocol != nil {
			sp.AppProtocol = valid(*p.AppProtocol)
		} else {
			sp.AppProtocol = inferProtocol(p.Name)
		}
		switch {
		case p.TargetPort.Type == intstr.String && p.TargetPort.StrVal != "":
			sp.TargetPort = valid(p.TargetPort.StrVal)
		case p.TargetPort.Type == intstr.Int && p.TargetPort.IntVal != 0:
			sp.TargetPort = strconv.Itoa(int(p.TargetPort.IntVal))
		default: // unset: Kubernetes defaults it to the port
			sp.TargetPort = strconv.Itoa(int(p.Port))
		}
		out = append(out, sp)
	}
	return out
}

// istioProtocols are the port name prefixes Istio recognizes
// (istio.io/istio pkg/config/protocol.Parse), lower case.
var istioProtocols = map[string]bool{
	"tcp": true, "udp": true, "grpc": true, "http": true, "http_proxy": true,
	"http2": true, "https": true, "tls": true, "mongo": true, "redis": true,
	"mysql": true,
}

// inferProtocol returns the protocol Istio infers from a port name, lower
// case, or "".
func inferProtocol(name string) string {
	const grpcWeb = "grpc-web"
	if len(name) >= len(grpcWeb) && strings.EqualFold(name[:len(grpcWeb)], grpcWeb) {
		return grpcWeb
	}
	if i := strings.IndexByte(name, '-'); i >= 0 {
		name = name[:i]
	}
	if len(name) > len("http_proxy") { // longer than any protocol: skip lowering it
		return ""
	}
	if p := strings.ToLower(name); istioProtocols[p] {
		return p
	}
	return ""
}

// subsets returns, for every label key all workloads carry, that sel does
// not name and whose values differ, the sorted distinct values.
func subsets(workloads []*relaypb.Workload, sel map[string]string) map[string]*relaypb.LabelValues {
	if len(workloads) < 2 {
		return nil
	}
	// Walk the smallest label set: every candidate key must be in it.
	base := workloads[0]
	for _, w := range workloads[1:] {
		if len(w.PodLabels) < len(base.PodLabels) {
			base = w
		}
	}
	var out map[string]*relaypb.LabelValues
	for k := range base.PodLabels {
		if _, ok := sel[k]; ok {
			continue
		}
		values := make([]string, 0, len(workloads))
		for _, w := range workloads {
			v, ok := w.PodLabels[k]
			if !ok {
				values = nil
				break
			}
			values = append(values, v)
		}
		if values == nil {
			continue
		}
		slices.Sort(values)
		values = slices.Compact(values)
		if len(values) < 2 {
			continue
		}
		if out == nil {
			out = map[string]*relaypb.LabelValues{}
		}
		out[k] = &relaypb.LabelValues{Values: slices.Clip(values)}
	}
	return out
}

// podReady reports whether a pod is an endpoint: it has an IP, is not being
// deleted or finished, and is ready (Ready=True, or Running without any
// conditions).
func podReady(p *corev1.Pod) bool {
	if p.Status.PodIP == "" || p.DeletionTimestamp != nil {
		return false
	}
	switch p.Status.Phase {
	case corev1.PodSucceeded, corev1.PodFailed:
		return false
	}
	if len(p.Status.Conditions) == 0 {
		return p.Status.Phase == corev1.PodRunning
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// copyMap copies a string map for the snapshot. Protobuf strings must be
// UTF-8: an entry whose key is not is dropped (renaming it could collide with
// another key), a value that is not is repaired.
func copyMap(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		if utf8.ValidString(k) {
			c[k] = valid(v)
		}
	}
	return c
}

// valid makes s fit a protobuf string field, replacing every invalid UTF-8
// sequence with U+FFFD. Objects from an API server are always valid
// already; this guards Build's other callers, since a snapshot that does
// not encode could be neither hashed nor sent.
func valid(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// sortedObjects returns the non-nil objects sorted by namespace, name and
// UID (the UID only breaks ties between impossible duplicates).
func sortedObjects[T any, PT interface {
	*T
	metav1.Object
}](objs []PT) []PT {
	out := make([]PT, 0, len(objs))
	for _, o := range objs {
		if o != nil {
			out = append(out, o)
		}
	}
	slices.SortFunc(out, func(a, b PT) int {
		return cmp.Or(
			strings.Compare(a.GetNamespace(), b.GetNamespace()),
			strings.Compare(a.GetName(), b.GetName()),
			strings.Compare(string(a.GetUID()), string(b.GetUID())),
		)
	})
	return out
}
