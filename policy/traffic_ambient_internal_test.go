package policy

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gatewayDurationFormat is the pattern of Gateway API's Duration.
var gatewayDurationFormat = regexp.MustCompile(`^([0-9]{1,5}(h|m|s|ms)){1,4}$`)

func TestGatewayDuration(t *testing.T) {
	for _, c := range []struct {
		in   time.Duration
		want string
		err  string
	}{
		{0, "0s", ""},
		{2 * time.Second, "2s", ""},
		{1500 * time.Millisecond, "1s500ms", ""},
		{90 * time.Minute, "1h30m", ""},
		{time.Hour + time.Millisecond, "1h1ms", ""},
		{99999 * time.Hour, "99999h", ""},
		{100000 * time.Hour, "", "longer than 99999 hours"},
		{time.Microsecond, "", "milliseconds"},
		{-time.Second, "", "negative"},
	} {
		got, err := gatewayDuration(c.in)
		assert.Equal(t, c.want, got, "%s", c.in)
		if c.err == "" {
			assert.Empty(t, err)
			assert.Regexp(t, gatewayDurationFormat, got)
		} else {
			assert.Contains(t, err, c.err)
		}
	}
}

func TestGRPCMethod(t *testing.T) {
	for _, c := range []struct {
		exact, prefix string
		svc, method   string
		ok            bool
	}{
		{exact: "/helloworld.Greeter/SayHello", svc: "helloworld.Greeter", method: "SayHello", ok: true},
		{prefix: "/helloworld.Greeter/", svc: "helloworld.Greeter", ok: true},
		{exact: "helloworld.Greeter/SayHello"},
		{exact: "/helloworld.Greeter/"},
		{exact: "/a/b/c"},
		{exact: "//SayHello"},
		{prefix: "/helloworld.Greeter"},
		{prefix: "/a/b/"},
		{prefix: "/"},
	} {
		u := &networkingv1alpha1.StringMatch{}
		if c.exact != "" {
			u.Exact = &c.exact
		} else {
			u.Prefix = &c.prefix
		}
		m, ok := grpcMethod(u)
		assert.Equal(t, c.ok, ok, "%+v", c)
		if ok {
			assert.Equal(t, c.svc, m.Service)
			assert.Equal(t, c.method, m.Method)
		}
	}
	_, ok := grpcMethod(&networkingv1alpha1.StringMatch{Regex: new("/.*")})
	assert.False(t, ok, "a regex is not a gRPC method match")
}

// FuzzGatewayDuration: every duration either renders in Gateway API's
// format, to the same length of time, or is refused with a reason.
func FuzzGatewayDuration(f *testing.F) {
	for _, d := range []int64{0, 1, int64(time.Millisecond), int64(1500 * time.Millisecond), int64(99999 * time.Hour), -1, 1 << 62} {
		f.Add(d)
	}
	f.Fuzz(func(t *testing.T, n int64) {
		got, why := gatewayDuration(time.Duration(n))
		if why != "" {
			if got != "" {
				t.Fatalf("%d: refused (%s) but rendered %q", n, why, got)
			}
			return
		}
		if !gatewayDurationFormat.MatchString(got) {
			t.Fatalf("%d rendered %q, not a Gateway API duration", n, got)
		}
		back, err := time.ParseDuration(got)
		if err != nil || back != time.Duration(n) {
			t.Fatalf("%d rendered %q, which is %s (%v)", n, got, back, err)
		}
	})
}

// FuzzAmbientMatcher: any request matcher either fails with a reason or
// becomes a match the Gateway API CRDs accept: a path that starts with
// '/', header names that are HTTP tokens, a method they list; a gRPC
// matcher becomes a service/method pair without '/'.
func FuzzAmbientMatcher(f *testing.F) {
	f.Add("/reviews", "exact", "x-canary", "true", "GET", false)
	f.Add("/helloworld.Greeter/SayHello", "exact", "x-tenant", "", "", true)
	f.Add("//a", "exact", "x a", "b", "BREW", false)
	f.Add(strings.Repeat("/a", 2000), "prefix", "", "", "", true)
	f.Fuzz(func(t *testing.T, uri, kind, header, value, method string, grpc bool) {
		m := &networkingv1alpha1.HTTPMatcher{Method: method}
		switch kind {
		case "exact":
			m.URI = &networkingv1alpha1.StringMatch{Exact: &uri}
		case "prefix":
			m.URI = &networkingv1alpha1.StringMatch{Prefix: &uri}
		}
		if header != "" {
			m.Headers = []networkingv1alpha1.HeaderMatcher{{Name: header, Value: value}}
		}
		if len(matcherProblems(m, grpc)) > 0 {
			return
		}
		tokenName := regexp.MustCompile("^[A-Za-z0-9!#$%&'*+\\-.^_`|~]+$")
		if grpc {
			g := grpcMatch(m)
			if g != nil && g.Method != nil && (strings.Contains(g.Method.Service, "/") || strings.Contains(g.Method.Method, "/") || g.Method.Service == "") {
				t.Fatalf("gRPC match %+v", g.Method)
			}
			return
		}
		h := httpMatch(m)
		if h == nil {
			return
		}
		if h.Path != nil && h.Path.Type != "RegularExpression" && (!strings.HasPrefix(h.Path.Value, "/") || strings.Contains(h.Path.Value, "//")) {
			t.Fatalf("path %+v", h.Path)
		}
		if h.Path != nil && h.Path.Type == "RegularExpression" {
			if _, err := regexp.Compile(h.Path.Value); err != nil {
				t.Fatalf("path regex %q: %v", h.Path.Value, err)
			}
		}
		for _, hm := range h.Headers {
			if !tokenName.MatchString(hm.Name) {
				t.Fatalf("header name %q", hm.Name)
			}
		}
		if h.Method != "" && !strings.Contains(" GET HEAD POST PUT DELETE CONNECT OPTIONS TRACE PATCH ", " "+h.Method+" ") {
			t.Fatalf("method %q", h.Method)
		}
	})
}

// TestRoutePorts: one route per port that can carry HTTP or gRPC, chosen by
// Istio's protocol selection (appProtocol, else the name's prefix; a name
// Istio does not know is sniffed, so it may carry HTTP); UDP, SCTP and the
// TCP protocols that are not HTTP get none; a Service with no such port is
// a problem naming its ports. Names: relaymesh-<svc> for one port, else
// relaymesh-<svc>.<port>.
func TestRoutePorts(t *testing.T) {
	dest := func(ports ...discoveryv1alpha1.ServicePort) *discoveryv1alpha1.Destination {
		d := &discoveryv1alpha1.Destination{}
		d.Spec.KubeService.Ref.Name = "svc"
		d.Spec.KubeService.Ports = ports
		return d
	}
	type want struct {
		port int32
		grpc bool
	}
	for _, tc := range []struct {
		name    string
		ports   []discoveryv1alpha1.ServicePort
		want    []want
		problem string
	}{
		{"http by name", []discoveryv1alpha1.ServicePort{{Port: 80, Name: "http-web", Protocol: "TCP"}}, []want{{80, false}}, ""},
		{"grpc by name", []discoveryv1alpha1.ServicePort{{Port: 9090, Name: "grpc", Protocol: "TCP"}}, []want{{9090, true}}, ""},
		{"appProtocol wins over the name", []discoveryv1alpha1.ServicePort{{Port: 9090, Name: "http", AppProtocol: "GRPC", Protocol: "TCP"}}, []want{{9090, true}}, ""},
		{"unnamed: sniffed", []discoveryv1alpha1.ServicePort{{Port: 8080, Protocol: "TCP"}}, []want{{8080, false}}, ""},
		{"unknown name: sniffed", []discoveryv1alpha1.ServicePort{{Port: 8080, Name: "metrics", Protocol: "TCP"}}, []want{{8080, false}}, ""},
		{"http and https", []discoveryv1alpha1.ServicePort{{Port: 8080, Name: "http"}, {Port: 8443, Name: "https"}}, []want{{8080, false}}, ""},
		{"http and grpc", []discoveryv1alpha1.ServicePort{{Port: 8080, Name: "http"}, {Port: 9090, Name: "grpc-api"}}, []want{{8080, false}, {9090, true}}, ""},
		{"udp and sctp never", []discoveryv1alpha1.ServicePort{{Port: 53, Name: "http", Protocol: "UDP"}, {Port: 38412, Protocol: "SCTP"}, {Port: 80, Name: "http"}}, []want{{80, false}}, ""},
		{"only tcp protocols", []discoveryv1alpha1.ServicePort{{Port: 6379, Name: "tcp-redis"}, {Port: 27017, AppProtocol: "mongo"}, {Port: 443, Name: "tls"}}, nil, "ports 6379 (tcp), 27017 (mongo), 443 (tls)"},
		{"no ports", nil, nil, "no HTTP or gRPC port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := dest(tc.ports...)
			got, problem := routePorts(d)
			if tc.problem != "" {
				assert.Contains(t, problem, tc.problem)
				assert.Empty(t, got)
				return
			}
			require.Empty(t, problem)
			var ports []want
			for _, rp := range got {
				ports = append(ports, want{rp.port.Port, rp.grpc})
			}
			assert.Equal(t, tc.want, ports)
			for _, rp := range got {
				name := routeName(d, rp.port.Port)
				if len(tc.ports) == 1 {
					assert.Equal(t, "relaymesh-svc", name)
				} else {
					assert.Equal(t, fmt.Sprintf("relaymesh-svc.%d", rp.port.Port), name)
				}
			}
		})
	}
}
