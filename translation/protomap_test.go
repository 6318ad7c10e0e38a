package translation

import (
	"encoding/json"
	"math"
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networkingv1 "istio.io/api/networking/v1"
	securityv1 "istio.io/api/security/v1"
	typev1beta1 "istio.io/api/type/v1beta1"
)

// roundTrip is what Add did before specMap: protojson, then encoding/json.
func roundTrip(m proto.Message) (map[string]any, error) {
	b, err := protojson.MarshalOptions{}.Marshal(m)
	if err != nil {
		return nil, err
	}
	var out map[string]any
	return out, json.Unmarshal(b, &out)
}

// sameSpec fails t unless protoSpec(m) is the round trip's result, in Go
// types (MergeSpecs compares with reflect.DeepEqual) and down to the bytes
// encoding/json writes of it (-0, NaN as text), or both fail.
func sameSpec(t testing.TB, m proto.Message) (fast bool) {
	want, wantErr := roundTrip(m)
	got, err := protoSpec(m)
	if wantErr != nil {
		if err == nil {
			t.Fatalf("%T: protojson refuses it (%v), specMap took it: %v", m, wantErr, got)
		}
		return false
	}
	if err != nil {
		t.Fatalf("%T: protojson takes it, protoSpec refuses it: %v", m, err)
	}
	wb, _ := json.Marshal(want)
	gb, _ := json.Marshal(got)
	if string(wb) != string(gb) || !reflect.DeepEqual(want, got) {
		t.Fatalf("%T:\n specMap    %#v\n round trip %#v", m, got, want)
	}
	_, fast = specMap(m.ProtoReflect())
	return fast
}

func istioSpecs() []proto.Message {
	pct := &networkingv1.Percent{Value: 12.5}
	return []proto.Message{
		&networkingv1.VirtualService{},
		&networkingv1.VirtualService{
			Hosts: []string{"reviews.bookinfo.svc.cluster.local", "ünïcode.example"}, Gateways: []string{"mesh"},
			Http: []*networkingv1.HTTPRoute{{
				Name: "route-0",
				Match: []*networkingv1.HTTPMatchRequest{{
					Uri:          &networkingv1.StringMatch{MatchType: &networkingv1.StringMatch_Prefix{Prefix: "/api"}},
					Headers:      map[string]*networkingv1.StringMatch{"x-user": {MatchType: &networkingv1.StringMatch_Exact{Exact: "<a&b>"}}, "x-empty": {}},
					SourceLabels: map[string]string{"app": "productpage", "version": ""},
					Port:         9080, IgnoreUriCase: true,
				}},
				Route: []*networkingv1.HTTPRouteDestination{
					{Destination: &networkingv1.Destination{Host: "reviews", Subset: "v1", Port: &networkingv1.PortSelector{Number: 9080}}, Weight: 90},
					{Destination: &networkingv1.Destination{Host: "reviews", Subset: "v2"}, Weight: 10},
				},
				Timeout:    durationpb.New(5_000_000_000),
				Retries:    &networkingv1.HTTPRetry{Attempts: 3, PerTryTimeout: &durationpb.Duration{Seconds: 2, Nanos: 500_000_000}, RetryOn: "5xx", RetryRemoteLocalities: wrapperspb.Bool(false)},
				Fault:      &networkingv1.HTTPFaultInjection{Delay: &networkingv1.HTTPFaultInjection_Delay{HttpDelayType: &networkingv1.HTTPFaultInjection_Delay_FixedDelay{FixedDelay: &durationpb.Duration{Nanos: 1_000}}, Percentage: pct}},
				Mirror:     &networkingv1.Destination{Host: "mirror"},
				CorsPolicy: &networkingv1.CorsPolicy{AllowCredentials: wrapperspb.Bool(true), MaxAge: &durationpb.Duration{Seconds: -3, Nanos: -1}},
				Headers:    &networkingv1.Headers{Request: &networkingv1.Headers_HeaderOperations{Set: map[string]string{"a": "1"}, Remove: []string{"b"}}},
			}},
		},
		&networkingv1.DestinationRule{
			Host: "reviews", ExportTo: []string{"."},
			TrafficPolicy: &networkingv1.TrafficPolicy{
				Tls:            &networkingv1.ClientTLSSettings{Mode: networkingv1.ClientTLSSettings_ISTIO_MUTUAL, Sni: "x", InsecureSkipVerify: wrapperspb.Bool(true)},
				ConnectionPool: &networkingv1.ConnectionPoolSettings{Tcp: &networkingv1.ConnectionPoolSettings_TCPSettings{MaxConnections: 100, ConnectTimeout: &durationpb.Duration{Seconds: 315576000000}}},
				OutlierDetection: &networkingv1.OutlierDetection{Consecutive_5XxErrors: wrapperspb.UInt32(math.MaxUint32), Interval: &durationpb.Duration{Nanos: 123_456_789},
					BaseEjectionTime: &durationpb.Duration{Seconds: 30, Nanos: 120_000}, MaxEjectionPercent: -1, MinHealthPercent: math.MaxInt32},
				LoadBalancer: &networkingv1.LoadBalancerSettings{LbPolicy: &networkingv1.LoadBalancerSettings_ConsistentHash{ConsistentHash: &networkingv1.LoadBalancerSettings_ConsistentHashLB{
					HashKey:       &networkingv1.LoadBalancerSettings_ConsistentHashLB_HttpHeaderName{HttpHeaderName: "x"},
					HashAlgorithm: &networkingv1.LoadBalancerSettings_ConsistentHashLB_Maglev{Maglev: &networkingv1.LoadBalancerSettings_ConsistentHashLB_MagLev{TableSize: math.MaxUint64}},
				}}},
			},
			Subsets: []*networkingv1.Subset{{Name: "v1", Labels: map[string]string{"version": "v1"}}, {Name: "v2"}},
		},
		&networkingv1.ServiceEntry{Hosts: []string{"db.example"}, Location: networkingv1.ServiceEntry_MESH_INTERNAL, Resolution: networkingv1.ServiceEntry_DNS,
			Ports:     []*networkingv1.ServicePort{{Number: 5432, Protocol: "TCP", Name: "pg", TargetPort: 15432}},
			Endpoints: []*networkingv1.WorkloadEntry{{Address: "10.0.0.1", Ports: map[string]uint32{"pg": 5432}, Labels: map[string]string{"a": "b"}, Network: "n1", Weight: 7}}},
		&networkingv1.Gateway{Selector: map[string]string{"istio": "eastwestgateway"}, Servers: []*networkingv1.Server{{
			Port: &networkingv1.Port{Number: 15443, Name: "tls", Protocol: "TLS"}, Hosts: []string{"*.local"},
			Tls: &networkingv1.ServerTLSSettings{Mode: networkingv1.ServerTLSSettings_AUTO_PASSTHROUGH, MinProtocolVersion: networkingv1.ServerTLSSettings_TLSV1_3}}}},
		&networkingv1.Sidecar{WorkloadSelector: &networkingv1.WorkloadSelector{Labels: map[string]string{"app": "a"}}, OutboundTrafficPolicy: &networkingv1.OutboundTrafficPolicy{Mode: networkingv1.OutboundTrafficPolicy_REGISTRY_ONLY}},
		&securityv1.AuthorizationPolicy{Action: securityv1.AuthorizationPolicy_DENY, Selector: &typev1beta1.WorkloadSelector{MatchLabels: map[string]string{"app": "x"}},
			Rules: []*securityv1.Rule{{From: []*securityv1.Rule_From{{Source: &securityv1.Source{Principals: []string{"td/ns/default/sa/a"}}}},
				To:   []*securityv1.Rule_To{{Operation: &securityv1.Operation{Methods: []string{"GET"}, Ports: []string{"80"}}}},
				When: []*securityv1.Condition{{Key: "request.auth.claims[iss]", Values: []string{"x"}}}}, {}}},
		&securityv1.AuthorizationPolicy{Action: securityv1.AuthorizationPolicy_Action(99)}, // a number no name has
		&securityv1.PeerAuthentication{Mtls: &securityv1.PeerAuthentication_MutualTLS{Mode: securityv1.PeerAuthentication_MutualTLS_STRICT},
			PortLevelMtls: map[uint32]*securityv1.PeerAuthentication_MutualTLS{8080: {Mode: securityv1.PeerAuthentication_MutualTLS_DISABLE}, 0: {}}},
	}
}

func TestSpecMapIsTheProtojsonRoundTrip(t *testing.T) {
	for _, m := range istioSpecs() {
		assert.True(t, sameSpec(t, m), "%T: the fast path should take it", m)
	}
	str, err := structpb.NewStruct(map[string]any{"a": 1.5, "b": []any{"x", true, nil, math.Copysign(0, -1)}, "c": map[string]any{}, "d": 1e21, "e": 1e-7, "\u2028<>&": "\u2028<>&"})
	require.NoError(t, err)
	assert.True(t, sameSpec(t, str))
	// Bare wrappers are no object: each against protojson's text of it,
	// decoded as encoding/json decodes it.
	for _, m := range []proto.Message{wrapperspb.Float(0.1), wrapperspb.Float(float32(math.Inf(-1))), wrapperspb.Float(float32(math.NaN())), wrapperspb.Float(3.4028235e38),
		wrapperspb.Float(1.4e-45), wrapperspb.Double(math.NaN()), wrapperspb.Double(math.Copysign(0, -1)), wrapperspb.Double(5e-324),
		wrapperspb.Int64(math.MinInt64), wrapperspb.UInt64(math.MaxUint64), wrapperspb.Bytes([]byte{0, 0xff}), wrapperspb.String("\u2028<>&")} {
		b, err := protojson.Marshal(m)
		require.NoError(t, err)
		var want any
		require.NoError(t, json.Unmarshal(b, &want))
		got, ok := wellKnown(m.ProtoReflect())
		require.True(t, ok, "%T", m)
		wb, _ := json.Marshal(want)
		gb, _ := json.Marshal(got)
		assert.Equal(t, string(wb), string(gb), "%T %s", m, b)
	}
}

func TestSpecMapFallsBackWhereProtojsonRefusesOrItDoesNotWalk(t *testing.T) {
	for name, m := range map[string]proto.Message{
		"invalid UTF-8":                         &networkingv1.VirtualService{Hosts: []string{"a\xffb"}},
		"a map key not UTF-8":                   &networkingv1.DestinationRule{Host: "r", Subsets: []*networkingv1.Subset{{Name: "v1", Labels: map[string]string{"a\xffb": "v1"}}}},
		"a Struct key not UTF-8":                &structpb.Struct{Fields: map[string]*structpb.Value{"\xff": structpb.NewBoolValue(true)}},
		"proto2 (required fields, MessageSets)": &descriptorpb.FileDescriptorProto{Name: proto.String("a.proto")},
		"signs differ":                          &networkingv1.HTTPRoute{Timeout: &durationpb.Duration{Seconds: 1, Nanos: -1}},
		"seconds out of range":                  &networkingv1.HTTPRoute{Timeout: &durationpb.Duration{Seconds: 315576000001}},
		"a whole second of nanos":               &networkingv1.HTTPRoute{Timeout: &durationpb.Duration{Nanos: 1e9}},
		"Value of no kind":                      &structpb.Struct{Fields: map[string]*structpb.Value{"a": {}}},
		"Value NaN":                             &structpb.Struct{Fields: map[string]*structpb.Value{"a": structpb.NewNumberValue(math.NaN())}},
	} {
		t.Run(name, func(t *testing.T) {
			_, fast := specMap(m.ProtoReflect())
			assert.False(t, fast)
			assert.False(t, sameSpec(t, m))
		})
	}
	obj, err := protoSpec(nil)
	require.NoError(t, err, "protojson writes nil as {}")
	assert.Equal(t, map[string]any{}, obj)
	a, err := anypb.New(&networkingv1.VirtualService{Hosts: []string{"x"}})
	require.NoError(t, err)
	_, fast := specMap(a.ProtoReflect())
	assert.False(t, fast, "Any is the round trip's")
	sameSpec(t, a)
}

// FuzzSpecMapIsTheProtojsonRoundTrip decodes the input as each kind of
// Istio spec translation writes and holds specMap to the round trip.
func FuzzSpecMapIsTheProtojsonRoundTrip(f *testing.F) {
	for _, m := range istioSpecs() {
		b, err := proto.Marshal(m)
		require.NoError(f, err)
		f.Add(b)
	}
	kinds := []func() proto.Message{
		func() proto.Message { return &networkingv1.VirtualService{} },
		func() proto.Message { return &networkingv1.DestinationRule{} },
		func() proto.Message { return &networkingv1.ServiceEntry{} },
		func() proto.Message { return &networkingv1.Gateway{} },
		func() proto.Message { return &networkingv1.Sidecar{} },
		func() proto.Message { return &networkingv1.WorkloadGroup{} },
		func() proto.Message { return &securityv1.AuthorizationPolicy{} },
		func() proto.Message { return &securityv1.PeerAuthentication{} },
		func() proto.Message { return &structpb.Struct{} },
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, kind := range kinds {
			m := kind()
			if proto.Unmarshal(b, m) == nil {
				sameSpec(t, m)
			}
		}
	})
}
