package discovery

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"istio.io/api/annotation"
	"istio.io/api/label"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
)

// What discovery reads of Istio's ambient data plane (see the package doc,
// "Ambient").
const (
	envAmbient          = "PILOT_ENABLE_AMBIENT"
	envMultiNetwork     = "AMBIENT_ENABLE_MULTI_NETWORK"
	valueZtunnel        = "ztunnel"
	valueAmbient        = "ambient"
	valueNone           = "none"
	valueRedirected     = "enabled"
	waypointClass       = "istio-waypoint"
	eastWestClass       = "istio-east-west"
	protocolHBONE       = "HBONE"
	waypointForService  = "service"
	waypointForWorkload = "workload"
	waypointForAll      = "all"
)

var (
	labelDataplaneMode        = label.IoIstioDataplaneMode.Name
	labelUseWaypoint          = label.IoIstioUseWaypoint.Name
	labelUseWaypointNamespace = label.IoIstioUseWaypointNamespace.Name
	labelWaypointFor          = label.IoIstioWaypointFor.Name
	labelGatewayName          = label.IoK8sNetworkingGatewayGatewayName.Name
	labelNetwork              = label.TopologyNetwork.Name
	annotationGatewaySA       = annotation.GatewayServiceAccount.Name
	annotationRedirection     = annotation.AmbientRedirection.Name
	annotationSidecarStatus   = annotation.SidecarStatus.Name
	containerSidecar          = "istio-proxy"
)

// GatewayResource is the Gateway API resource discovery reads waypoints from.
var GatewayResource = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gateways"}

// ambientEnabled reports whether an istiod Deployment runs with
// PILOT_ENABLE_AMBIENT set to a true value in any container.
func ambientEnabled(d *appsv1.Deployment) bool { return envTrue(d, envAmbient) }

// envTrue reports whether a container of d sets name to a true value.
func envTrue(d *appsv1.Deployment, name string) bool {
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, e := range c.Env {
			if e.Name == name {
				if on, err := strconv.ParseBool(e.Value); err == nil && on {
					return true
				}
			}
		}
	}
	return false
}

func isZtunnel(labels map[string]string) bool { return labels[labelApp] == valueZtunnel }

// isWaypointPod reports whether a pod template belongs to a Gateway's
// deployment (waypoints included): it is a proxy, not a workload.
func isWaypointPod(labels map[string]string) bool {
	_, ok := labels[labelGatewayName]
	return ok
}

// ztunnels marks the ambient meshes with a ztunnel DaemonSet in their
// namespace.
func (b *builder) ztunnels(daemonSets []*appsv1.DaemonSet) {
	for _, d := range daemonSets {
		if !isZtunnel(d.Spec.Template.Labels) && !isZtunnel(d.Labels) {
			continue
		}
		for _, m := range b.meshByNs[d.Namespace] {
			if m.Ambient {
				m.Ztunnel = true
			}
		}
	}
}

// waypoints attaches the Gateways of class istio-waypoint to the ambient
// mesh of their revision (istio.io/rev, else the default revision).
func (b *builder) waypoints(gateways []*unstructured.Unstructured, deployments []*appsv1.Deployment) {
	accounts := map[nsName]string{} // the first Deployment by name wins
	for _, d := range deployments {
		if gw, ok := d.Spec.Template.Labels[labelGatewayName]; ok {
			k := nsName{d.Namespace, gw}
			if _, seen := accounts[k]; !seen {
				accounts[k] = serviceAccount(&d.Spec.Template)
			}
		}
	}
	for _, gw := range gateways {
		class, _, _ := unstructured.NestedString(gw.Object, "spec", "gatewayClassName")
		if class != waypointClass {
			continue
		}
		m := b.meshByRev[normalizeRevision(gw.GetLabels()[labelRevision])]
		if m == nil || !m.Ambient {
			continue
		}
		trafficType := cmp.Or(gw.GetLabels()[labelWaypointFor], waypointForService)
		switch trafficType {
		case waypointForService, waypointForWorkload, waypointForAll, valueNone:
		default:
			continue // istiod does not know it either
		}
		addrs, _, _ := unstructured.NestedSlice(gw.Object, "status", "addresses")
		m.Waypoints = append(m.Waypoints, &relaypb.Waypoint{
			Name:           valid(gw.GetName()),
			Namespace:      valid(gw.GetNamespace()),
			TrafficType:    trafficType,
			ServiceAccount: accounts[nsName{gw.GetNamespace(), gw.GetName()}],
			Ready:          len(addrs) > 0,
		})
	}
}

// eastWestGateways sets each ambient mesh's network (the
// topology.istio.io/network label of its namespace, as ambient istiod
// reads it) and attaches the Gateways of class istio-east-west of its
// revision that carry a network label and an HBONE listener: where other
// networks reach the mesh's global services over double HBONE. A Gateway
// without either is not one istiod uses, and is left out.
func (b *builder) eastWestGateways(gateways []*unstructured.Unstructured) {
	for _, m := range b.meshList {
		if m.Ambient {
			m.Network = validLabelValue(b.nsLabels[m.Namespace][labelNetwork])
		}
	}
	for _, gw := range gateways {
		class, _, _ := unstructured.NestedString(gw.Object, "spec", "gatewayClassName")
		network := validLabelValue(gw.GetLabels()[labelNetwork])
		if class != eastWestClass || network == "" {
			continue
		}
		m := b.meshByRev[normalizeRevision(gw.GetLabels()[labelRevision])]
		if m == nil || !m.Ambient {
			continue
		}
		port := hbonePort(gw)
		if port == 0 {
			continue
		}
		g := &relaypb.EastWestGateway{
			Name:           valid(gw.GetName()),
			Namespace:      valid(gw.GetNamespace()),
			Network:        network,
			HbonePort:      port,
			ServiceAccount: valid(cmp.Or(gw.GetAnnotations()[annotationGatewaySA], gw.GetName())),
		}
		addrs, _, _ := unstructured.NestedSlice(gw.Object, "status", "addresses")
		for _, a := range addrs {
			am, _ := a.(map[string]any)
			value, _ := am["value"].(string)
			if t, _ := am["type"].(string); (t == "" || t == "IPAddress" || t == "Hostname") && value != "" && len(g.Addresses) < maxGatewayAddresses {
				g.Addresses = append(g.Addresses, valid(value))
			}
		}
		m.EastWestGateways = append(m.EastWestGateways, g)
	}
}

// maxGatewayAddresses is how many status addresses of an east-west
// gateway are reported.
const maxGatewayAddresses = 16

// hbonePort is the port of a Gateway's first HBONE listener, 0 without
// one (or with a port out of range).
func hbonePort(gw *unstructured.Unstructured) int32 {
	listeners, _, _ := unstructured.NestedSlice(gw.Object, "spec", "listeners")
	for _, l := range listeners {
		lm, _ := l.(map[string]any)
		if p, _ := lm["protocol"].(string); p != protocolHBONE {
			continue
		}
		switch port := lm["port"].(type) {
		case int64:
			if port >= 1 && port <= 65535 {
				return int32(port)
			}
		case float64:
			if port >= 1 && port <= 65535 && port == float64(int32(port)) {
				return int32(port)
			}
		}
	}
	return 0
}

// validLabelValue is s when it is a valid label value, else "".
func validLabelValue(s string) string {
	if len(validation.IsValidLabelValue(s)) > 0 {
		return ""
	}
	return s
}

// ambientEnrolled reports whether pods of tmpl in a namespace with nsLabels
// are captured by ztunnel (istio-cni's default enablement selectors), and
// from which revision. The caller has ruled out a sidecar: a pod with one
// is never captured.
func ambientEnrolled(nsLabels map[string]string, tmpl *corev1.PodTemplateSpec) (revision string, enrolled bool) {
	podMode := tmpl.Labels[labelDataplaneMode]
	if podMode != valueAmbient && (podMode == valueNone || nsLabels[labelDataplaneMode] != valueAmbient) {
		return "", false
	}
	if rev, ok := tmpl.Labels[labelRevision]; ok {
		return normalizeRevision(rev), true
	}
	return normalizeRevision(nsLabels[labelRevision]), true
}

// waypointRef resolves istio.io/use-waypoint on an object's labels, else
// on its namespace's; "none" on the object opts out of the namespace's.
func waypointRef(objLabels, nsLabels map[string]string, namespace string) *relaypb.WaypointRef {
	labels := objLabels
	name, ok := labels[labelUseWaypoint]
	if !ok {
		labels = nsLabels
		name = labels[labelUseWaypoint]
	}
	ns := cmp.Or(labels[labelUseWaypointNamespace], namespace)
	// A name no Gateway can have binds to nothing (istiod finds no such
	// waypoint either); reporting it would get the snapshot refused.
	if name == "" || name == valueNone || len(validation.IsDNS1123Subdomain(name)) > 0 || len(validation.IsDNS1123Label(ns)) > 0 {
		return nil
	}
	return &relaypb.WaypointRef{Name: name, Namespace: ns}
}

// sortWaypoints sorts every mesh's waypoints by namespace and name, and
// keeps the first of equal names (impossible in a cluster).
func (b *builder) sortWaypoints() {
	for _, m := range b.meshList {
		key := func(a, b *relaypb.Waypoint) int {
			return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
		}
		slices.SortStableFunc(m.Waypoints, key)
		m.Waypoints = slices.CompactFunc(m.Waypoints, func(a, b *relaypb.Waypoint) bool { return key(a, b) == 0 })
	}
}

// workloadMode decides whether a controller's pods run with a sidecar (mode
// "") or in ambient mode, and the mesh that serves them; ok is false when
// they are in no discovered mesh.
func (b *builder) workloadMode(meta *metav1.ObjectMeta, tmpl *corev1.PodTemplateSpec) (m *relaypb.Mesh, mode string, ok bool) {
	// ztunnel and waypoint pods are the data plane, not workloads, even in
	// a namespace that injects sidecars.
	if isZtunnel(tmpl.Labels) || isWaypointPod(tmpl.Labels) {
		return nil, "", false
	}
	ns := b.nsLabels[meta.Namespace]
	if rev, injected := injection(ns, tmpl); injected {
		m = b.meshByRev[rev]
		return m, "", m != nil
	}
	if rev, enrolled := ambientEnrolled(ns, tmpl); enrolled {
		m = b.meshByRev[rev]
		return m, discoveryv1alpha1.DataPlaneAmbient, m != nil && m.Ambient
	}
	return nil, "", false
}

// destinationMode is the data-plane mode of a Service's workloads: "" when
// all have sidecars, "ambient" when none has, "mixed" otherwise.
func destinationMode(selected []*relaypb.Workload) string {
	var sidecar, ambient bool
	for _, w := range selected {
		if w.DataPlaneMode == discoveryv1alpha1.DataPlaneAmbient {
			ambient = true
		} else {
			sidecar = true
		}
	}
	switch {
	case ambient && sidecar:
		return discoveryv1alpha1.DataPlaneMixed
	case ambient:
		return discoveryv1alpha1.DataPlaneAmbient
	}
	return ""
}

// PodRedirected reports whether istio-cni captured a pod for ztunnel (its
// annotation ambient.istio.io/redirection: enabled).
func PodRedirected(p *corev1.Pod) bool {
	return p.Annotations[annotationRedirection] == valueRedirected
}

// PodHasSidecar reports whether a running pod was injected: the injector's
// status annotation, or an istio-proxy container (a native sidecar is an
// init container).
func PodHasSidecar(p *corev1.Pod) bool {
	if _, ok := p.Annotations[annotationSidecarStatus]; ok {
		return true
	}
	for _, cs := range [][]corev1.Container{p.Spec.Containers, p.Spec.InitContainers} {
		for _, c := range cs {
			if c.Name == containerSidecar {
				return true
			}
		}
	}
	return false
}

// podModes records which data planes a Destination's ready pods run in.
type podModes struct{ sidecar, ambient bool }

func (m *podModes) add(p *corev1.Pod) {
	switch {
	case PodHasSidecar(p):
		m.sidecar = true
	case PodRedirected(p):
		m.ambient = true
	}
}

// mode is a Destination's mode once its ready pods are counted too: the
// pod templates say where the workloads are going, the pods where they are.
// Relabelling a namespace from sidecar injection to ambient changes the
// templates' mode at once, while the old pods keep their sidecars until they
// restart (and a rollback leaves captured pods behind). Until every ready pod
// agrees with the templates the Destination is mixed, so the sidecar-era
// policy stays for the pods that still read it and the ztunnel and waypoint
// policies are in place before the first ambient pod serves.
func (m podModes) mode(templates string) string {
	if templates == discoveryv1alpha1.DataPlaneAmbient && m.sidecar || templates == "" && m.ambient {
		return discoveryv1alpha1.DataPlaneMixed
	}
	return templates
}
