package istiod

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
)

// Type URLs istiod serves a ztunnel (pkg/model/xds.go).
const (
	AddressTypeURL       = "type.googleapis.com/istio.workload.Address"
	AuthorizationTypeURL = "type.googleapis.com/istio.security.Authorization"
)

// ProxyConfigTypeURL is PCDS: with ISTIO_MULTIROOT_MESH istiod pushes
// every proxy the workload trust bundle it holds
// (ProxyConfig.caCertificatesPem): its own root, meshConfig
// caCertificates, and what it fetched from their spiffeBundleUrl.
const ProxyConfigTypeURL = "type.googleapis.com/istio.mesh.v1alpha1.ProxyConfig"

// TrustBundle parses the roots of the ProxyConfig among res, a PCDS
// watch's resources.
func TrustBundle(res map[string]*anypb.Any) ([]*x509.Certificate, error) {
	if len(res) != 1 {
		return nil, fmt.Errorf("PCDS: %d ProxyConfigs, want 1", len(res))
	}
	var pc meshv1alpha1.ProxyConfig
	for _, a := range res {
		if err := a.UnmarshalTo(&pc); err != nil {
			return nil, fmt.Errorf("PCDS: %w", err)
		}
	}
	var out []*x509.Certificate
	for _, p := range pc.GetCaCertificatesPem() {
		certs, err := parseCerts([]byte(p))
		if err != nil {
			return nil, fmt.Errorf("PCDS caCertificatesPem: %w", err)
		}
		out = append(out, certs...)
	}
	return out, nil
}

// istioVersion is the proxy version a posing client announces: the
// pinned Istio's, so istiod does not fall back to older behaviour.
const istioVersion = "1.31.1"

// ZtunnelNode is the xDS node a ztunnel on a node with address ip sends
// (ztunnel src/xds/client.rs node()): istiod reads the node type from the
// first field of the ID and refuses it unless it runs in ambient mode.
func (d *Istiod) ZtunnelNode(ip string) *corev3.Node {
	ns := d.cfg.Namespace
	meta, _ := structpb.NewStruct(map[string]any{
		"NAME":          "ztunnel-test",
		"NAMESPACE":     ns,
		"INSTANCE_IPS":  ip,
		"NODE_NAME":     "node-test",
		"CLUSTER_ID":    d.cfg.ClusterID,
		"ISTIO_VERSION": istioVersion,
	})
	return &corev3.Node{
		Id:       fmt.Sprintf("ztunnel~%s~ztunnel-test.%s~%s.svc.cluster.local", ip, ns, ns),
		Metadata: meta,
	}
}

// DeltaWatch is one delta-ADS stream to istiod's plaintext xDS port,
// subscribed (wildcard, as ztunnel does) to one type. It ACKs every
// response and keeps the current resources by name.
type DeltaWatch struct {
	conn    *grpc.ClientConn
	typeURL string
	cancel  context.CancelFunc
	done    chan struct{}

	mu        sync.Mutex
	resources map[string]*anypb.Any
	responses int
	err       error
}

// WatchDelta opens a delta ADS stream as node and subscribes to every
// resource of typeURL. Close it when done.
func (d *Istiod) WatchDelta(ctx context.Context, node *corev3.Node, typeURL string) (*DeltaWatch, error) {
	return d.WatchDeltaNames(ctx, node, typeURL, nil)
}

// WatchDeltaNames is WatchDelta subscribed to the named resources only,
// as Envoy subscribes to the endpoints (EDS) of the clusters it was sent;
// no names is the wildcard subscription.
func (d *Istiod) WatchDeltaNames(ctx context.Context, node *corev3.Node, typeURL string, names []string) (*DeltaWatch, error) {
	conn, err := grpc.NewClient(d.addrs.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("xds dial %s: %w", d.addrs.GRPC, err)
	}
	sctx, cancel := context.WithCancel(ctx)
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(sctx)
	if err == nil {
		err = stream.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNamesSubscribe: names})
	}
	if err != nil {
		cancel()
		conn.Close()
		return nil, fmt.Errorf("xds subscribe %s: %w", typeURL, err)
	}
	w := &DeltaWatch{conn: conn, typeURL: typeURL, cancel: cancel, done: make(chan struct{}), resources: map[string]*anypb.Any{}}
	go w.run(stream)
	return w, nil
}

func (w *DeltaWatch) run(stream discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient) {
	defer close(w.done)
	for {
		resp, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("istiod closed the stream")
			}
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
			return
		}
		w.mu.Lock()
		if resp.GetTypeUrl() == w.typeURL {
			for _, r := range resp.GetResources() {
				w.resources[r.GetName()] = r.GetResource()
			}
			for _, name := range resp.GetRemovedResources() {
				delete(w.resources, name)
			}
			w.responses++
		}
		w.mu.Unlock()
		if err := stream.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}); err != nil {
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
			return
		}
	}
}

// Snapshot returns the current resources by name and how many responses
// of the watched type arrived, or the error that ended the stream.
func (w *DeltaWatch) Snapshot() (map[string]*anypb.Any, int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]*anypb.Any, len(w.resources))
	for k, v := range w.resources {
		out[k] = v
	}
	return out, w.responses, w.err
}

// Names returns the names of the current resources, sorted.
func (w *DeltaWatch) Names() []string {
	res, _, _ := w.Snapshot()
	return sortedKeys(res)
}

// Await polls until check accepts the current resources, the stream ends
// or ctx is done; the error then carries check's last complaint.
func (w *DeltaWatch) Await(ctx context.Context, check func(map[string]*anypb.Any) error) error {
	var last error
	for {
		res, _, err := w.Snapshot()
		if err != nil {
			return fmt.Errorf("xds stream %s: %w (last check: %v)", w.typeURL, err, last)
		}
		if last = check(res); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w: %w", w.typeURL, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Close ends the stream and the connection.
func (w *DeltaWatch) Close() error {
	w.cancel()
	<-w.done
	return w.conn.Close()
}

// Envoy's listener, cluster and endpoint types, which a waypoint pulls.
const (
	ListenerTypeURL = "type.googleapis.com/envoy.config.listener.v3.Listener"
	ClusterTypeURL  = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	EndpointTypeURL = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
)

// WaypointNode is the xDS node of a waypoint proxy pod (an Envoy started by
// istio-agent): istiod reads the node type "waypoint" from the ID, and
// finds the Services it serves through the pod at ip, its namespace and its
// gateway-name label.
func (d *Istiod) WaypointNode(ip, pod, namespace, gateway, serviceAccount string) *corev3.Node {
	return d.proxyNode("waypoint", ip, pod, namespace, serviceAccount, map[string]string{"gateway.networking.k8s.io/gateway-name": gateway})
}

// SidecarNode is the xDS node of an injected pod's istio-proxy (an Envoy
// started by istio-agent): istiod reads the node type "sidecar" from the
// ID, finds the pod at ip, and builds its inbound listeners from the
// Services that select the pod's labels.
func (d *Istiod) SidecarNode(ip, pod, namespace, serviceAccount string, labels map[string]string) *corev3.Node {
	return d.proxyNode("sidecar", ip, pod, namespace, serviceAccount, labels)
}

// proxyNode is the node an istio-agent sends for an Envoy of type kind in
// pod at ip.
func (d *Istiod) proxyNode(kind, ip, pod, namespace, serviceAccount string, labels map[string]string) *corev3.Node {
	l := map[string]any{}
	for k, v := range labels {
		l[k] = v
	}
	meta, _ := structpb.NewStruct(map[string]any{
		"NAME":            pod,
		"NAMESPACE":       namespace,
		"INSTANCE_IPS":    ip,
		"CLUSTER_ID":      d.cfg.ClusterID,
		"ISTIO_VERSION":   istioVersion,
		"SERVICE_ACCOUNT": serviceAccount,
		"LABELS":          l,
	})
	return &corev3.Node{
		Id:       fmt.Sprintf("%s~%s~%s.%s~%s.svc.cluster.local", kind, ip, pod, namespace, namespace),
		Metadata: meta,
	}
}
