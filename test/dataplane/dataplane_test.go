package dataplane

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.step.sm/crypto/pemutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/xds"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

var node = Node{
	IP: "10.20.1.7", Pod: "echo-v1", Namespace: "apps", ServiceAccount: "echo", ClusterID: "cluster-1",
	Labels: map[string]string{"app": "echo", "version": "v1"}, Port: 41000,
}

func TestNodeID(t *testing.T) {
	assert.Equal(t, "sidecar~10.20.1.7~echo-v1.apps~apps.svc.cluster.local", node.ID())
}

func TestBootstrapIsWhatGRPCAndIstiodRead(t *testing.T) {
	b, err := Bootstrap(BootstrapConfig{Node: node, XDSAddress: "127.0.0.1:15010", CertDir: "/certs", Refresh: 1500 * time.Millisecond})
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal(b, &got))
	n := got["node"].(map[string]any)
	assert.Equal(t, node.ID(), n["id"])
	md := n["metadata"].(map[string]any)
	assert.Equal(t, "grpc", md["GENERATOR"])
	assert.Equal(t, "apps", md["NAMESPACE"])
	assert.Equal(t, "cluster-1", md["CLUSTER_ID"])
	assert.Equal(t, "10.20.1.7", md["INSTANCE_IPS"])
	assert.Equal(t, "echo", md["SERVICE_ACCOUNT"])
	assert.Equal(t, map[string]any{"app": "echo", "version": "v1"}, md["LABELS"])
	assert.JSONEq(t, `[{"name":"grpc","containerPort":41000,"protocol":"TCP"}]`, md["POD_PORTS"].(string))
	assert.Equal(t, "xds.istio.io/grpc/lds/inbound/%s", got["server_listener_resource_name_template"])
	cp := got["certificate_providers"].(map[string]any)["default"].(map[string]any)
	assert.Equal(t, "file_watcher", cp["plugin_name"])
	assert.Equal(t, map[string]any{
		"certificate_file": "/certs/cert-chain.pem", "private_key_file": "/certs/key.pem",
		"ca_certificate_file": "/certs/root-cert.pem", "refresh_interval": "1.5s",
	}, cp["config"])

	// gRPC's own parser accepts it: an xDS server needs every part (the
	// listener template, the certificate provider) and parses it now.
	srv, err := xds.NewGRPCServer(xds.BootstrapContentsForTesting(b))
	require.NoError(t, err)
	srv.Stop()
	// The check can fail: a bootstrap without the template is refused.
	var broken map[string]any
	require.NoError(t, json.Unmarshal(b, &broken))
	delete(broken, "server_listener_resource_name_template")
	bb, err := json.Marshal(broken)
	require.NoError(t, err)
	_, err = xds.NewGRPCServer(xds.BootstrapContentsForTesting(bb))
	require.ErrorContains(t, err, "server_listener_resource_name_template")
}

func TestBootstrapRejectsBadInput(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*BootstrapConfig)
		want   []string
	}{
		{"public", func(c *BootstrapConfig) { c.Node.IP = "8.8.8.8" }, []string{"ip:"}},
		{"loopback", func(c *BootstrapConfig) { c.Node.IP = "127.0.0.1" }, []string{"ip:"}},
		{"ipv6", func(c *BootstrapConfig) { c.Node.IP = "fd00::1" }, []string{"ip:"}},
		{"names", func(c *BootstrapConfig) {
			c.Node.Pod, c.Node.Namespace, c.Node.ServiceAccount, c.Node.ClusterID = "Echo~1", "a.b", "", "a b"
		}, []string{"pod:", "namespace:", "serviceAccount:", "clusterID:"}},
		{"label", func(c *BootstrapConfig) { c.Node.Labels = map[string]string{"a b": "c", "ok": strings.Repeat("x", 64)} }, []string{`key "a b"`, "labels[ok]"}},
		{"port", func(c *BootstrapConfig) { c.Node.Port = 70000 }, []string{"port:"}},
		{"xds address", func(c *BootstrapConfig) { c.XDSAddress = "istiod" }, []string{"xdsAddress:"}},
		{"relative cert dir", func(c *BootstrapConfig) { c.CertDir = "certs" }, []string{"certDir:"}},
		{"refresh", func(c *BootstrapConfig) { c.Refresh = time.Nanosecond }, []string{"refresh:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := BootstrapConfig{Node: node, XDSAddress: "127.0.0.1:15010", CertDir: "/certs"}
			c.Node.Labels = map[string]string{"app": "echo"}
			tt.modify(&c)
			b, err := Bootstrap(c)
			require.Error(t, err)
			assert.Nil(t, b)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestDurationJSON(t *testing.T) {
	for d, want := range map[time.Duration]string{
		time.Second: "1s", 1500 * time.Millisecond: "1.5s", 15 * time.Minute: "900s", time.Millisecond: "0.001s",
	} {
		assert.Equal(t, want, durationJSON(d))
	}
}

func TestRequestRoundTripAndLimits(t *testing.T) {
	r, err := DecodeRequest(Request{Delay: 1500 * time.Millisecond}.Encode())
	require.NoError(t, err)
	assert.Equal(t, 1500*time.Millisecond, r.Delay)
	for name, s := range map[string]*structpb.Struct{
		"negative":   {Fields: map[string]*structpb.Value{"delay_ms": structpb.NewNumberValue(-1)}},
		"too long":   {Fields: map[string]*structpb.Value{"delay_ms": structpb.NewNumberValue(31_000)}},
		"fraction":   {Fields: map[string]*structpb.Value{"delay_ms": structpb.NewNumberValue(1.5)}},
		"nan":        {Fields: map[string]*structpb.Value{"delay_ms": structpb.NewNumberValue(math.NaN())}},
		"string":     {Fields: map[string]*structpb.Value{"delay_ms": structpb.NewStringValue("1")}},
		"unknown":    {Fields: map[string]*structpb.Value{"exec": structpb.NewStringValue("rm")}},
		"huge value": {Fields: map[string]*structpb.Value{"delay_ms": structpb.NewNumberValue(math.Inf(1))}},
	} {
		_, err := DecodeRequest(s)
		assert.Error(t, err, name)
	}
}

func TestReplyRoundTripAndLimits(t *testing.T) {
	want := Reply{Workload: "echo-v1", Namespace: "apps", Cluster: "cluster-1", ServiceAccount: "echo", Version: "v1", Peer: "spiffe://cluster-1.local/ns/apps/sa/sleep", PeerIssuer: "0011223344556677"}
	got, err := DecodeReply(want.Encode())
	require.NoError(t, err)
	assert.Equal(t, want, got)
	for name, s := range map[string]*structpb.Struct{
		"no workload": {Fields: map[string]*structpb.Value{"version": structpb.NewStringValue("v1")}},
		"not string":  {Fields: map[string]*structpb.Value{"workload": structpb.NewNumberValue(1)}},
		"too long":    {Fields: map[string]*structpb.Value{"workload": structpb.NewStringValue(strings.Repeat("x", 513))}},
		"unknown":     {Fields: map[string]*structpb.Value{"workload": structpb.NewStringValue("w"), "x": structpb.NewStringValue("y")}},
	} {
		_, err := DecodeReply(s)
		assert.Error(t, err, name)
	}
	many := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i := range 17 {
		many.Fields[strings.Repeat("k", i+1)] = structpb.NewStringValue("v")
	}
	_, err = DecodeReply(many)
	assert.ErrorContains(t, err, "at most 16")
}

// FuzzDecodeReply feeds the reply decoder what a server could send: it
// never panics, and what it accepts encodes back to an equal reply.
func FuzzDecodeReply(f *testing.F) {
	for _, r := range []Reply{{Workload: "w"}, {Workload: "echo-v1", Version: "v1", Peer: "spiffe://td/ns/a/sa/b"}} {
		b, err := proto.Marshal(r.Encode())
		require.NoError(f, err)
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		var s structpb.Struct
		if proto.Unmarshal(b, &s) != nil {
			return
		}
		r, err := DecodeReply(&s)
		if err != nil {
			return
		}
		again, err := DecodeReply(r.Encode())
		require.NoError(t, err)
		require.Equal(t, r, again)
	})
}

// FuzzDecodeRequest: the server's decoder never panics and accepts only
// delays within MaxDelay.
func FuzzDecodeRequest(f *testing.F) {
	b, err := proto.Marshal(Request{Delay: time.Second}.Encode())
	require.NoError(f, err)
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		var s structpb.Struct
		if proto.Unmarshal(b, &s) != nil {
			return
		}
		r, err := DecodeRequest(&s)
		if err == nil {
			require.True(t, r.Delay >= 0 && r.Delay <= MaxDelay, "delay %v", r.Delay)
		}
	})
}

func TestCallOptionsValidate(t *testing.T) {
	require.NoError(t, CallOptions{Headers: map[string]string{"x-canary": "yes", "end-user": "jason"}}.validate())
	for name, o := range map[string]CallOptions{
		"upper case":   {Headers: map[string]string{"X-Canary": "yes"}},
		"pseudo":       {Headers: map[string]string{":path": "/x"}},
		"binary":       {Headers: map[string]string{"x-bin": "a"}},
		"grpc":         {Headers: map[string]string{"grpc-timeout": "1S"}},
		"control char": {Headers: map[string]string{"x": "a\nb"}},
		"delay":        {Request: Request{Delay: time.Hour}},
		"concurrency":  {Concurrency: 1000},
		"timeout":      {Timeout: -time.Second},
	} {
		assert.Error(t, o.validate(), name)
	}
}

func TestOutcomes(t *testing.T) {
	o := NewOutcomes()
	o.Add(codes.OK, Reply{Workload: "a", Version: "v1", Cluster: "c1"}, "")
	o.Add(codes.OK, Reply{Workload: "b", Version: "v2", Cluster: "c1", Peer: "spiffe://x"}, "")
	o.Add(codes.Unavailable, Reply{}, "fault filter abort")
	o.Add(codes.Unavailable, Reply{}, "fault filter abort")
	assert.Equal(t, 4, o.Total())
	assert.Equal(t, 2, o.Failed())
	assert.Equal(t, 2, o.Code(codes.Unavailable))
	assert.Equal(t, 1, o.Version("v1"))
	assert.Equal(t, 2, o.Cluster("c1"))
	assert.Equal(t, 1, o.Peer("spiffe://x"))
	assert.Equal(t, 1, o.Peer(""))
	assert.InDelta(t, 50.0, o.Percent(o.Code(codes.OK)), 1e-9)
	assert.Equal(t, `4 RPCs; codes: OK=2 Unavailable=2; workloads: a=1 b=1; versions: v1=1 v2=1; clusters: c1=2; peers: ""=1 spiffe://x=1; errors: Unavailable: fault filter abort=2`, o.String())
	for i := range 20 {
		o.Add(codes.Internal, Reply{}, strings.Repeat("e", i))
	}
	assert.LessOrEqual(t, strings.Count(o.String(), "Internal:"), maxDistinctErrors)
	assert.Zero(t, NewOutcomes().Percent(0))
}

func TestIPPool(t *testing.T) {
	for _, b := range []byte{0, 96, 255} {
		_, err := NewIPPool(b)
		require.Error(t, err, b)
	}
	p, err := NewIPPool(42)
	require.NoError(t, err)
	seen := map[string]bool{}
	for range 600 {
		a, err := p.Next()
		require.NoError(t, err)
		require.False(t, seen[a.PodIP], a.PodIP)
		seen[a.PodIP] = true
		require.True(t, strings.HasPrefix(a.PodIP, "10.42."), a.PodIP)
		require.Equal(t, "127"+strings.TrimPrefix(a.PodIP, "10"), a.Bind)
		require.False(t, strings.HasSuffix(a.PodIP, ".0") || strings.HasSuffix(a.PodIP, ".255"), a.PodIP)
		to, err := Loopback(a.PodIP + ":7070")
		require.NoError(t, err)
		require.Equal(t, a.Bind+":7070", to)
	}
	assert.True(t, seen["10.42.1.1"] && seen["10.42.0.254"] && !seen["10.42.1.0"])
}

func TestLoopbackRefusesOtherNetworks(t *testing.T) {
	to, err := Loopback("127.0.0.1:15010")
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:15010", to)
	for _, a := range []string{"192.168.1.1:80", "8.8.8.8:53", "[::1]:80", "istiod:15010", "10.1.2.3"} {
		_, err := Loopback(a)
		assert.Error(t, err, a)
	}
}

func TestEndpointSlice(t *testing.T) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: "apps"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 7070, TargetPort: intstr.FromString("grpc"), Protocol: corev1.ProtocolTCP}}},
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "echo-v1", Namespace: "apps", UID: "u1"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Ports: []corev1.ContainerPort{{Name: "grpc", ContainerPort: 41000, Protocol: corev1.ProtocolTCP}}}}},
		Status:     corev1.PodStatus{PodIP: "10.20.1.7"},
	}
	s := endpointSlice(svc, pod)
	require.NotNil(t, s)
	assert.Equal(t, "echo", s.Labels["kubernetes.io/service-name"])
	assert.Equal(t, []string{"10.20.1.7"}, s.Endpoints[0].Addresses)
	assert.Equal(t, int32(41000), *s.Ports[0].Port)
	assert.Equal(t, "echo-v1", s.Endpoints[0].TargetRef.Name)
	// Another Pod, another slice.
	pod2 := pod.DeepCopy()
	pod2.Name = "echo-v2"
	assert.NotEqual(t, s.Name, endpointSlice(svc, pod2).Name)
	// A Pod without the named port has no endpoint.
	pod2.Spec.Containers[0].Ports[0].Name = "http"
	assert.Nil(t, endpointSlice(svc, pod2))

	ready := &corev1.Pod{Status: corev1.PodStatus{PodIP: "10.0.0.9", Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	assert.True(t, podReady(ready))
	notReady := ready.DeepCopy()
	notReady.Status.Conditions[0].Status = corev1.ConditionFalse
	assert.False(t, podReady(notReady))
	deleting := ready.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	assert.False(t, podReady(deleting))
}

func TestConfigsRefuseBadInput(t *testing.T) {
	_, err := NewCluster(ClusterConfig{})
	require.Error(t, err)
	for _, w := range []string{"cluster: required", "istiod: required", "dir: required", "ips: required"} {
		assert.Contains(t, err.Error(), w)
	}
	err = WorkloadConfig{Name: "Echo", Namespace: "", ServiceAccount: "a/b", Labels: map[string]string{"": "x"}}.Validate()
	require.Error(t, err)
	for _, w := range []string{"name:", "namespace:", "serviceAccount:", "labels:"} {
		assert.Contains(t, err.Error(), w)
	}
	// A Service is checked before anything is written (no cluster needed).
	err = (&Cluster{}).Service(context.Background(), ServiceConfig{Name: "echo-h2", Namespace: "apps", Selector: map[string]string{"app": "echo"}, Port: 7070,
		AppProtocol: "http 2", Labels: map[string]string{"relaymesh.io/route-api": "gateway api"}})
	require.Error(t, err)
	for _, w := range []string{"appProtocol:", "labels[relaymesh.io/route-api]:"} {
		assert.Contains(t, err.Error(), w)
	}
	ok := WorkloadConfig{Name: "ping-1", Namespace: "apps", ServiceAccount: "ping", Serve: true, Port: 7070, MaxConnectionAge: time.Second}
	require.NoError(t, ok.Validate())
	for name, modify := range map[string]func(*WorkloadConfig){
		"port of a client": func(c *WorkloadConfig) { c.Serve, c.MaxConnectionAge = false, 0 },
		"port":             func(c *WorkloadConfig) { c.Port = 70000 },
		"negative port":    func(c *WorkloadConfig) { c.Port = -1 },
		"age of a client":  func(c *WorkloadConfig) { c.Serve, c.Port = false, 0 },
		"age too short":    func(c *WorkloadConfig) { c.MaxConnectionAge = time.Millisecond },
		"negative age":     func(c *WorkloadConfig) { c.MaxConnectionAge = -time.Second },
	} {
		c := ok
		modify(&c)
		assert.Error(t, c.Validate(), name)
	}
	for name, cfg := range map[string]LoadConfig{
		"no flows":    {Rate: 10},
		"no rate":     {Flows: []Flow{{Name: "a", From: &Workload{}}}},
		"huge rate":   {Flows: []Flow{{Name: "a", From: &Workload{}}}, Rate: 1_000_000},
		"two names":   {Flows: []Flow{{Name: "a", From: &Workload{}}, {Name: "a", From: &Workload{}}}, Rate: 10},
		"no workload": {Flows: []Flow{{Name: "a"}}, Rate: 10},
		"workers":     {Flows: []Flow{{Name: "a", From: &Workload{}}}, Rate: 10, Workers: 1000},
		"timeout":     {Flows: []Flow{{Name: "a", From: &Workload{}}}, Rate: 10, Timeout: -time.Second},
	} {
		l, err := StartLoad("x", cfg)
		assert.Error(t, err, name)
		assert.Nil(t, l, name)
	}
}

// The xDS proxy sends new connections to the target of the moment and
// leaves open ones where they are, as a Service in front of a rolling
// update does; Close ends every forwarded connection.
func TestXDSProxyFollowsItsTarget(t *testing.T) {
	serve := func(name string) string {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { lis.Close() })
		go func() {
			for {
				c, err := lis.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					buf := make([]byte, 1)
					for {
						if _, err := c.Read(buf); err != nil {
							return
						}
						if _, err := c.Write([]byte(name)); err != nil {
							return
						}
					}
				}()
			}
		}()
		return lis.Addr().String()
	}
	a, b := serve("a"), serve("b")
	p, err := newXDSProxy(a)
	require.NoError(t, err)
	ask := func(c net.Conn) string {
		_, err := c.Write([]byte("?"))
		require.NoError(t, err)
		buf := make([]byte, 1)
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		_, err = io.ReadFull(c, buf)
		require.NoError(t, err)
		return string(buf)
	}
	first, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer first.Close()
	assert.Equal(t, "a", ask(first))
	p.SetTarget(b)
	second, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer second.Close()
	assert.Equal(t, "b", ask(second), "a new connection goes to the new target")
	assert.Equal(t, "a", ask(first), "an open connection stays where it is")

	require.NoError(t, p.Close())
	require.NoError(t, first.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = first.Read(make([]byte, 1))
	assert.Error(t, err, "Close ends forwarded connections")
	_, err = net.Dial("tcp", p.Addr())
	assert.Error(t, err, "and stops listening")
}

func TestOutcomesMerge(t *testing.T) {
	a, b := NewOutcomes(), NewOutcomes()
	a.add(codes.OK, Reply{Workload: "w", Cluster: "c1", PeerIssuer: "i1"}, "s1", "")
	b.add(codes.OK, Reply{Workload: "w", Cluster: "c2", PeerIssuer: "i1"}, "s2", "")
	b.Add(codes.Unavailable, Reply{}, "x509: certificate signed by unknown authority")
	a.Merge(b)
	assert.Equal(t, 3, a.Total())
	assert.Equal(t, 1, a.Failed())
	assert.Equal(t, 2, a.PeerIssuer("i1"))
	assert.Equal(t, 1, a.ServerIssuer("s1"))
	assert.Equal(t, 1, a.ServerIssuer("s2"))
	assert.Equal(t, 1, a.Cluster("c2"))
	assert.Equal(t, 1, a.ErrorsWith("unknown authority"))
	assert.Equal(t, 2, b.Total(), "the merged-in counts are unchanged")
}

// IssuerID of a certificate is KeyID of the CA that signed it, and another
// CA's differs.
func TestIssuerIDNamesTheSigningCA(t *testing.T) {
	root, err := NewRoot("issuer-id")
	require.NoError(t, err)
	cacerts, err := root.CACerts(context.Background(), "istiod-cluster-1", "cluster-1.local")
	require.NoError(t, err)
	inter, err := pemutil.ParseCertificate(cacerts["ca-cert.pem"])
	require.NoError(t, err)
	assert.Equal(t, KeyID(root.Cert()), IssuerID(inter))
	assert.Len(t, KeyID(inter), 16)
	other, err := NewRoot("other")
	require.NoError(t, err)
	assert.NotEqual(t, KeyID(other.Cert()), IssuerID(inter))
}
