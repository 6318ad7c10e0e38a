package dataplane

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/relaymesh/relaymesh/test/istiod"
	"github.com/relaymesh/relaymesh/test/localcluster"
)

// Labels and names the harness puts on the objects it writes in place of a
// kubelet and the endpoint-slice controller.
const (
	// FieldManager is the harness's server-side-apply field manager.
	FieldManager = "relaymesh-dataplane"
	// managedBy marks the EndpointSlices the harness maintains.
	managedBy = "relaymesh-dataplane-test"
	// PortName is the name of every Service port and Pod container port
	// the harness writes: "grpc", so istiod treats the port as gRPC.
	PortName = "grpc"
	// workloadImage is the image the harness's Pods and Deployments name;
	// nothing pulls it.
	workloadImage = "relaymesh.test/dataplane:proxyless"
)

// ClusterConfig says which cluster to run workloads in.
type ClusterConfig struct {
	// Cluster is the local cluster. Required.
	Cluster *localcluster.Cluster
	// Istiod is the cluster's running istiod. Required. The cluster owns
	// it from now on: RestartIstiod replaces it, StopIstiod stops it.
	Istiod *istiod.Istiod
	// IstiodConfig is what Istiod was started with; RestartIstiod starts
	// its successors from it (other cacerts, a directory of their own).
	// Without it the cluster cannot restart istiod.
	IstiodConfig istiod.Config
	// Dir holds the workloads' certificates and bootstraps. Required.
	Dir string
	// IPs hands out the workloads' loopback addresses; share one pool
	// between clusters whose workloads must not collide (all of them, for
	// a flat network). Required.
	IPs *IPPool
	// Log receives the harness's own events; default: discarded.
	Log *slog.Logger
}

// Cluster runs workloads in one local cluster against its istiod, and does
// what a kubelet and the endpoint-slice controller would: Pod status and
// EndpointSlices.
type Cluster struct {
	cfg  ClusterConfig
	kube kubernetes.Interface
	dyn  dynamic.Interface
	maps meta.RESTMapper
	log  *slog.Logger

	// syncMu serializes EndpointSlice syncs, which read then write.
	syncMu sync.Mutex

	// xds is istiod's stable address; istiodMu guards the istiod it
	// forwards to; restartMu serializes restarts.
	xds       *xdsProxy
	restartMu sync.Mutex
	istiodMu  sync.Mutex
	current   *istiod.Istiod
	restarts  int

	mu        sync.Mutex
	workloads []*Workload
}

// NewCluster checks cfg and connects to the cluster.
func NewCluster(cfg ClusterConfig) (*Cluster, error) {
	var errs []error
	if cfg.Cluster == nil {
		errs = append(errs, errors.New("cluster: required"))
	}
	if cfg.Istiod == nil {
		errs = append(errs, errors.New("istiod: required"))
	}
	if cfg.Dir == "" {
		errs = append(errs, errors.New("dir: required"))
	}
	if cfg.IPs == nil {
		errs = append(errs, errors.New("ips: required"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("dataplane cluster: %w", err)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	kube, err := cfg.Cluster.Clientset()
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg.Cluster.RESTConfig())
	if err != nil {
		return nil, err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg.Cluster.RESTConfig())
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	xds, err := newXDSProxy(cfg.Istiod.Addresses().GRPC)
	if err != nil {
		return nil, err
	}
	return &Cluster{
		cfg: cfg, kube: kube, dyn: dyn, xds: xds, current: cfg.Istiod,
		maps: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)),
		log:  cfg.Log.With("component", "dataplane", "cluster", cfg.Cluster.Name),
	}, nil
}

// Name is the cluster's name.
func (c *Cluster) Name() string { return c.cfg.Cluster.Name }

// Istiod is the cluster's current istiod.
func (c *Cluster) Istiod() *istiod.Istiod {
	c.istiodMu.Lock()
	defer c.istiodMu.Unlock()
	return c.current
}

// XDSAddress is where the cluster's workloads reach istiod's xDS: a stable
// address that forwards to the current istiod (istiod's Service).
func (c *Cluster) XDSAddress() string { return c.xds.Addr() }

// TrustDomain is the trust domain of the cluster's mesh.
func (c *Cluster) TrustDomain() string { return c.cfg.Istiod.TrustDomain() }

// RestartIstiod replaces the cluster's istiod with one that loads cacerts,
// the way a rolling update of the istiod Deployment does after its cacerts
// Secret changed: the new istiod starts beside the old one, takes new xDS
// connections once ready, and then the old one stops (its workloads'
// xDS streams reconnect to the new one; they keep the configuration they
// have meanwhile). It returns how long it took. On error the old istiod
// keeps serving.
func (c *Cluster) RestartIstiod(ctx context.Context, cacerts map[string][]byte) (time.Duration, error) {
	c.restartMu.Lock()
	defer c.restartMu.Unlock()
	cfg := c.cfg.IstiodConfig
	if cfg.Kubeconfig == "" || cfg.Dir == "" {
		return 0, fmt.Errorf("cluster %s: no istiod config to restart istiod from", c.Name())
	}
	c.restarts++
	cfg.Dir = fmt.Sprintf("%s-%d", cfg.Dir, c.restarts)
	cfg.CACerts = cacerts
	start := time.Now()
	d, err := istiod.Start(ctx, cfg)
	if err != nil {
		return 0, fmt.Errorf("cluster %s: restart istiod: %w", c.Name(), err)
	}
	c.xds.SetTarget(d.Addresses().GRPC)
	c.istiodMu.Lock()
	old := c.current
	c.current = d
	c.istiodMu.Unlock()
	if err := old.Stop(); err != nil {
		c.log.Warn("old istiod did not stop cleanly", "err", err)
	}
	took := time.Since(start)
	c.log.Info("istiod restarted", "after", took.Round(time.Millisecond), "dir", cfg.Dir)
	return took, nil
}

// StopIstiod stops the cluster's istiod and its stable address.
func (c *Cluster) StopIstiod() error {
	c.restartMu.Lock()
	defer c.restartMu.Unlock()
	return errors.Join(c.xds.Close(), c.Istiod().Stop())
}

// Kube is an admin client of the cluster.
func (c *Cluster) Kube() kubernetes.Interface { return c.kube }

// Namespace creates the namespace if it does not exist.
func (c *Cluster) Namespace(ctx context.Context, name string, labels map[string]string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if _, err := c.kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("namespace %s: %w", name, err)
	}
	return nil
}

// ServiceConfig is a Service of gRPC workloads.
type ServiceConfig struct {
	// Name and Namespace of the Service. The namespace must exist.
	Name, Namespace string
	// Selector picks the Service's workloads by Pod labels. Required.
	Selector map[string]string
	// Port is the Service port clients dial (xds:///name.ns.svc.cluster.local:Port).
	Port int32
	// TargetPort is the Pods' port number behind Port (what flat-network
	// federation needs: discovery reports numbers, not what a name
	// resolves to in each Pod); 0: the container port named PortName,
	// which may differ from Pod to Pod.
	TargetPort int32
	// AppProtocol of the port, which is how Istio tells its protocol;
	// empty: grpc. (http2 makes a Gateway API HTTPRoute, not a GRPCRoute,
	// Relaymesh's route for it.)
	AppProtocol string
	// Labels of the Service besides app: <Name>.
	Labels map[string]string
}

// Service creates (or updates) the Service and writes its EndpointSlices
// for the workloads it selects.
func (c *Cluster) Service(ctx context.Context, cfg ServiceConfig) error {
	var errs []error
	if len(cfg.Name) > 63 || !dnsLabel.MatchString(cfg.Name) {
		errs = append(errs, fmt.Errorf("name: %q is not a DNS label", cfg.Name))
	}
	if len(cfg.Namespace) > 63 || !dnsLabel.MatchString(cfg.Namespace) {
		errs = append(errs, fmt.Errorf("namespace: %q is not a DNS label", cfg.Namespace))
	}
	if len(cfg.Selector) == 0 {
		errs = append(errs, errors.New("selector: required"))
	}
	errs = append(errs, validateLabels("selector", cfg.Selector)...)
	errs = append(errs, validateLabels("labels", cfg.Labels)...)
	if cfg.AppProtocol != "" && len(validation.IsQualifiedName(cfg.AppProtocol)) > 0 {
		errs = append(errs, fmt.Errorf("appProtocol: %q is not a protocol name", cfg.AppProtocol))
	}
	if cfg.Port < 1 || cfg.Port > 65535 {
		errs = append(errs, fmt.Errorf("port: %d is not a port", cfg.Port))
	}
	if cfg.TargetPort < 0 || cfg.TargetPort > 65535 {
		errs = append(errs, fmt.Errorf("targetPort: %d is not a port", cfg.TargetPort))
	}
	target := intstr.FromString(PortName)
	if cfg.TargetPort > 0 {
		target = intstr.FromInt32(cfg.TargetPort)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("service: %w", err)
	}
	svcLabels := maps.Clone(cfg.Labels)
	if svcLabels == nil {
		svcLabels = map[string]string{}
	}
	svcLabels["app"] = cfg.Name
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: cfg.Name, Namespace: cfg.Namespace, Labels: svcLabels},
		Spec: corev1.ServiceSpec{
			Selector: cfg.Selector,
			Ports: []corev1.ServicePort{{
				Name: PortName, Port: cfg.Port, TargetPort: target,
				Protocol: corev1.ProtocolTCP, AppProtocol: new(cmp.Or(cfg.AppProtocol, "grpc")),
			}},
		},
	}
	svcs := c.kube.CoreV1().Services(cfg.Namespace)
	cur, err := svcs.Get(ctx, cfg.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = svcs.Create(ctx, svc, metav1.CreateOptions{})
	case err == nil:
		cur.Spec.Selector, cur.Spec.Ports, cur.Labels = svc.Spec.Selector, svc.Spec.Ports, svc.Labels
		_, err = svcs.Update(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("service %s/%s: %w", cfg.Namespace, cfg.Name, err)
	}
	return c.SyncEndpoints(ctx, cfg.Namespace)
}

// Deployment writes a Deployment for a workload: selector and pod template
// labels are the workload's labels, the template runs as its service
// account. It is an API object only (no controller makes Pods from it);
// Relaymesh's discovery reads workloads from controllers like it.
func (c *Cluster) Deployment(ctx context.Context, cfg WorkloadConfig) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("deployment: %w", err)
	}
	if len(cfg.Labels) == 0 {
		return errors.New("deployment: the workload has no labels to select its pods by")
	}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: cfg.Name, Namespace: cfg.Namespace, Labels: cfg.Labels},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: cfg.Labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: cfg.Labels, Annotations: map[string]string{"inject.istio.io/templates": "grpc-agent"}},
				Spec: corev1.PodSpec{
					ServiceAccountName: cfg.ServiceAccount,
					Containers:         []corev1.Container{{Name: "app", Image: workloadImage}},
				},
			},
		},
	}
	_, err := c.kube.AppsV1().Deployments(cfg.Namespace).Create(ctx, d, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("deployment %s/%s: %w", cfg.Namespace, cfg.Name, err)
	}
	return nil
}

// SyncEndpoints does the endpoint-slice controller's job for a namespace:
// every Service with a selector gets one EndpointSlice per ready Pod it
// selects (Pods name their container port, so each slice carries its Pod's
// port), and slices of Pods that are gone or no longer selected are
// deleted. Only slices the harness manages are touched.
func (c *Cluster) SyncEndpoints(ctx context.Context, namespace string) error {
	c.syncMu.Lock()
	defer c.syncMu.Unlock()
	svcs, err := c.kube.CoreV1().Services(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("sync endpoints in %s: %w", namespace, err)
	}
	pods, err := c.kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("sync endpoints in %s: %w", namespace, err)
	}
	slices := c.kube.DiscoveryV1().EndpointSlices(namespace)
	have, err := slices.List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelManagedBy + "=" + managedBy})
	if err != nil {
		return fmt.Errorf("sync endpoints in %s: %w", namespace, err)
	}
	want := map[string]*discoveryv1.EndpointSlice{}
	for i := range svcs.Items {
		svc := &svcs.Items[i]
		if len(svc.Spec.Selector) == 0 {
			continue
		}
		sel := labels.SelectorFromSet(svc.Spec.Selector)
		for j := range pods.Items {
			pod := &pods.Items[j]
			if !sel.Matches(labels.Set(pod.Labels)) || !podReady(pod) {
				continue
			}
			if s := endpointSlice(svc, pod); s != nil {
				want[s.Name] = s
			}
		}
	}
	var errs []error
	for i := range have.Items {
		cur := &have.Items[i]
		w, ok := want[cur.Name]
		if !ok {
			if err := slices.Delete(ctx, cur.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, err)
			}
			continue
		}
		delete(want, cur.Name)
		w.ResourceVersion = cur.ResourceVersion
		if _, err := slices.Update(ctx, w, metav1.UpdateOptions{}); err != nil {
			errs = append(errs, err)
		}
	}
	for _, name := range sortedKeys(want) {
		if _, err := slices.Create(ctx, want[name], metav1.CreateOptions{}); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sync endpoints in %s: %w", namespace, err)
	}
	return nil
}

// endpointSlice is the slice of one Pod of svc, or nil when the Pod has no
// container port for the Service's target port.
func endpointSlice(svc *corev1.Service, pod *corev1.Pod) *discoveryv1.EndpointSlice {
	var ports []discoveryv1.EndpointPort
	for _, sp := range svc.Spec.Ports {
		n, ok := containerPort(pod, sp)
		if !ok {
			continue
		}
		ports = append(ports, discoveryv1.EndpointPort{Name: new(sp.Name), Port: new(n), Protocol: new(sp.Protocol), AppProtocol: sp.AppProtocol})
	}
	if len(ports) == 0 {
		return nil
	}
	// One slice per (Service, Pod): the Pod's name is hashed, not parsed.
	sum := sha256.Sum256([]byte(svc.Name + "/" + pod.Name))
	name := fmt.Sprintf("%.40s-%s", svc.Name, hex.EncodeToString(sum[:])[:12])
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: svc.Namespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: managedBy},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{pod.Status.PodIP},
			Conditions: discoveryv1.EndpointConditions{Ready: new(true), Serving: new(true), Terminating: new(false)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
		}},
		Ports: ports,
	}
}

// containerPort resolves a Service port's target port on a Pod: a named
// target port is looked up among the Pod's container ports.
func containerPort(pod *corev1.Pod, sp corev1.ServicePort) (int32, bool) {
	if sp.TargetPort.Type == intstr.Int {
		if sp.TargetPort.IntVal == 0 {
			return sp.Port, true
		}
		return sp.TargetPort.IntVal, true
	}
	for _, ctr := range pod.Spec.Containers {
		for _, p := range ctr.Ports {
			if p.Name == sp.TargetPort.StrVal && p.Protocol == sp.Protocol {
				return p.ContainerPort, true
			}
		}
	}
	return 0, false
}

func podReady(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp != nil || pod.Status.PodIP == "" || pod.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Apply server-side-applies a YAML manifest (Istio objects, for one) with
// the harness's field manager.
func (c *Cluster) Apply(ctx context.Context, manifest string) error {
	_, err := c.cfg.Cluster.Apply(ctx, FieldManager, []byte(manifest))
	return err
}

// Delete deletes every object of a YAML manifest; objects already gone are
// not an error.
func (c *Cluster) Delete(ctx context.Context, manifest string) error {
	objs, err := localcluster.DecodeObjects([]byte(manifest))
	if err != nil {
		return err
	}
	var errs []error
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := c.maps.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", gvk.Kind, o.GetName(), err))
			continue
		}
		ri := c.dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		if m.Scope.Name() != meta.RESTScopeNameNamespace {
			err = c.dyn.Resource(m.Resource).Delete(ctx, o.GetName(), metav1.DeleteOptions{})
		} else {
			err = ri.Delete(ctx, o.GetName(), metav1.DeleteOptions{})
		}
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete %s %s/%s: %w", gvk.Kind, o.GetNamespace(), o.GetName(), err))
		}
	}
	return errors.Join(errs...)
}

// Address is where a workload is: the Pod IP the cluster knows, and the
// loopback address the workload binds on this machine.
//
// The API server refuses loopback addresses in EndpointSlices, so Pods get
// addresses of a private network, 10.B.C.D, and the harness plays the pod
// network: 10.B.C.D is served at 127.B.C.D (Linux routes all of 127/8 to
// lo, so every such address can be bound without configuration), and a
// client connects to a Pod IP at its loopback twin (Loopback). Everything
// istiod and gRPC decide (which endpoint, which TLS, which route) is about
// Pod IPs; only the final TCP connect is mapped.
type Address struct {
	// PodIP is the Pod's status.podIP: 10.B.C.D.
	PodIP string
	// Bind is 127.B.C.D.
	Bind string
}

// IPPool hands out addresses 10.B.C.D / 127.B.C.D: B is fixed per pool,
// C.D counts up, skipping .0 and .255 in the last octet.
type IPPool struct {
	mu   sync.Mutex
	b    byte
	next uint32
}

// NewIPPool returns a pool of 10.b.0.0/16; b must be 1..254 and not 96
// (the local clusters' Service range is 10.96.0.0/16).
func NewIPPool(b byte) (*IPPool, error) {
	if b == 0 || b == 255 || b == 96 {
		return nil, fmt.Errorf("ip pool: second octet %d must be 1..254 and not 96", b)
	}
	return &IPPool{b: b, next: 1}, nil
}

// Next returns an unused address.
func (p *IPPool) Next() (Address, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.next < 1<<16 {
		n := p.next
		p.next++
		if d := n & 0xff; d == 0 || d == 255 {
			continue
		}
		return Address{
			PodIP: net.IPv4(10, p.b, byte(n>>8), byte(n)).String(),
			Bind:  net.IPv4(127, p.b, byte(n>>8), byte(n)).String(),
		}, nil
	}
	return Address{}, errors.New("ip pool: exhausted")
}

// Loopback maps a "host:port" of a Pod IP (10/8) to its loopback twin on
// this machine. Loopback addresses are returned as they are; any other
// address is refused: on this pod network nothing else exists.
func Loopback(hostport string) (string, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", fmt.Errorf("pod network: %w", err)
	}
	ip := net.ParseIP(host).To4()
	switch {
	case ip == nil:
		return "", fmt.Errorf("pod network: %q is not an IPv4 address", host)
	case ip[0] == 10:
		return net.JoinHostPort(net.IPv4(127, ip[1], ip[2], ip[3]).String(), port), nil
	case ip[0] == 127:
		return hostport, nil
	}
	return "", fmt.Errorf("pod network: no route to %s", host)
}

// workloadDir returns the directory for a workload's files.
func (c *Cluster) workloadDir(namespace, pod string) (string, error) {
	dir := filepath.Join(c.cfg.Dir, namespace, pod)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	return dir, nil
}

// StopWorkloads stops every workload the cluster started.
func (c *Cluster) StopWorkloads(ctx context.Context) error {
	c.mu.Lock()
	ws := c.workloads
	c.workloads = nil
	c.mu.Unlock()
	var errs []error
	for _, w := range ws {
		errs = append(errs, w.Stop(ctx))
	}
	return errors.Join(errs...)
}
