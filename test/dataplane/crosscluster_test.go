package dataplane_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/relaymesh/relaymesh/test/dataplane"
)

// TestFlatNetworkByHand shows the harness across clusters with Istio
// objects written by hand: a client in cluster-1 reaches the server in
// cluster-2 at its Pod IP (no gateway), over mTLS with certificates from
// the two meshes' intermediates of one root. These are the objects a
// flat-network federation has to produce in the client's cluster: a
// ServiceEntry for the remote host whose endpoints are the remote Pods,
// naming their SPIFFE IDs, and ISTIO_MUTUAL for it; in the server's
// cluster, STRICT mTLS.
func TestFlatNetworkByHand(t *testing.T) {
	f := sharedFixture(t)
	const host = "echo.apps.svc.cluster-2.global"
	f.applyTo(t, f.c2, strictPeerAuthentication)
	serviceEntry := func(san string) string {
		return fmt.Sprintf(`
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: echo-cluster-2, namespace: apps}
spec:
  hosts: [%s]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 7070, name: grpc, protocol: GRPC}]
  subjectAltNames: [%s]
  endpoints:
  - {address: %s, ports: {grpc: %d}, labels: {app: echo, version: v3}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo-cluster-2, namespace: apps}
spec:
  host: %s
  trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}
`, host, san, f.v3.Address().PodIP, f.v3.Port(), host)
	}
	// The client verifies the server's identity: a ServiceEntry that names
	// another one (here what istiod would derive from the endpoint's
	// service account, in the client's own trust domain) fails the
	// handshake.
	f.apply(t, serviceEntry("spiffe://cluster-1.local/ns/apps/sa/echo"))
	c, err := f.sleep.DialHost(host, echoPort)
	require.NoError(t, err)
	defer c.Close()
	f.settle(t, c, "the server's identity refused", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool { return o.ErrorsWith("SANs") == o.Total() })
	o := run(t, c, 100, dataplane.CallOptions{})
	require.Equal(t, 100, o.ErrorsWith("SANs"), "a server certificate without the expected SAN is refused")

	f.apply(t, serviceEntry(f.v3.SPIFFEID()))
	f.settle(t, c, "cluster-2 answers", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool { return o.Code(codes.OK) == o.Total() })
	o = run(t, c, batch/2, dataplane.CallOptions{})
	assert.Equal(t, batch/2, o.Cluster("cluster-2"), "every call answered in cluster-2")
	assert.Equal(t, batch/2, o.Peer(f.sleep.SPIFFEID()), "over mTLS: cluster-2's server saw cluster-1's client identity")
}
