package dataplane_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/relaymesh/relaymesh/policy/accessaudit"
	"github.com/relaymesh/relaymesh/test/dataplane"
)

// The access audit's matrix against counted RPCs: every (source,
// destination, port) the audit calls allowed succeeds, every one it calls
// denied fails, with an AccessPolicy present that admission refuses.

// auditPolicies are the Relaymesh objects of the check: mTLS from cluster-1's
// clients to both Services of cluster-1 (its namespace is STRICT), the one
// real AccessPolicy (sleep to echo), and an AccessPolicy that selects every
// source and destination without the relaymesh.io/allow-all opt-in, which
// the server's admission refuses. Were it in force, every identity of
// cluster-1 would reach echo.
const auditPolicies = `
apiVersion: networking.relaymesh.io/v1alpha1
kind: TrafficPolicy
metadata: {name: mtls, namespace: relaymesh}
spec:
  sourceSelector: [{clusters: [cluster-1]}]
  destinationSelector:
  - kubeServiceRefs:
      services:
      - {name: echo, namespace: apps, clusterName: cluster-1}
      - {name: ping, namespace: apps, clusterName: cluster-1}
  policy:
    mtls: {tlsMode: ISTIO_MUTUAL}
---
apiVersion: networking.relaymesh.io/v1alpha1
kind: AccessPolicy
metadata: {name: echo-readers, namespace: relaymesh}
spec:
  sourceSelector:
  - kubeServiceAccountRefs:
      serviceAccounts: [{name: sleep, namespace: apps, clusterName: cluster-1}]
  destinationSelector:
  - kubeServiceRefs:
      services: [{name: echo, namespace: apps, clusterName: cluster-1}]
---
apiVersion: networking.relaymesh.io/v1alpha1
kind: AccessPolicy
metadata: {name: allow-all, namespace: relaymesh}
spec:
  sourceSelector: [{kubeIdentityMatcher: {}}]
  destinationSelector: [{kubeServiceMatcher: {}}]
`

// Counts of the check.
const (
	auditBatch    = 50 // counted RPCs per pair
	auditProbe    = 20 // RPCs per settling probe
	remoteTimeout = 2 * time.Second
)

// checkAuditMatchesTraffic runs `relaymesh policy audit` against the live
// management cluster and calls every pair of its matrix's sources and
// destinations.
func checkAuditMatchesTraffic(t *testing.T, f *fixture, r *relaymesh) {
	f.apply(t, strictPeerAuthentication)
	r.apply(t, auditPolicies)
	// The policies are in effect: other is denied echo, sleep gets it over
	// mTLS from both versions. (This does not read the audit.)
	f.settle(t, f.fromOth, "the policy denies other", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool {
		return o.Code(codes.PermissionDenied) == o.Total()
	})
	f.settle(t, f.toEcho, "mTLS from sleep", dataplane.CallOptions{}, func(o *dataplane.Outcomes) bool {
		return o.Peer(f.sleep.SPIFFEID()) == o.Total() && bothVersions(o)
	})

	ctx := context.Background()
	out, err := r.run(ctx, "policy", "audit", "--kubeconfig", r.mgmt.Kubeconfig, "-n", "relaymesh", "-o", "json", "--fail-on", "none")
	require.NoError(t, err)
	var res accessaudit.Result
	require.NoError(t, json.Unmarshal([]byte(out), &res))

	// The source identities of the audit are the fixture's workloads.
	byID := map[string]*dataplane.Workload{
		"cluster-1/apps/echo": f.v1, "cluster-1/apps/sleep": f.sleep, "cluster-1/apps/other": f.other, "cluster-1/apps/ping": f.ping1,
		"cluster-2/apps/echo": f.v3, "cluster-2/apps/sleep": f.sleep2, "cluster-2/apps/ping": f.ping2,
	}
	var sources []accessaudit.Source
	for _, s := range res.Matrix.Sources {
		if _, ok := byID[s.ID]; ok {
			sources = append(sources, s)
		}
	}
	require.Len(t, sources, len(byID), "every workload is a source identity of the audit: %+v", res.Matrix.Sources)
	allowed := map[string]bool{}
	for _, p := range res.Matrix.Pairs {
		allowed[p.Source+" → "+p.Destination+fmt.Sprintf(":%d", p.Port)] = true
		for _, g := range p.Grants {
			assert.NotEqual(t, "relaymesh/allow-all", g.Policy, "the refused policy grants nothing")
		}
	}
	refused := slices.ContainsFunc(res.Findings, func(f accessaudit.Finding) bool {
		return f.Kind == accessaudit.KindRefused && f.Objects[0] == "AccessPolicy/relaymesh/allow-all"
	})
	assert.True(t, refused, "the audit reports the allow-all policy refused by admission")

	var local, remote int
	for _, d := range res.Matrix.Destinations {
		if d.Namespace != ns {
			continue
		}
		for _, port := range d.Ports {
			require.Equal(t, int32(echoPort), port.Number, "%s", d.ID)
			for _, s := range sources {
				w := byID[s.ID]
				pair := fmt.Sprintf("%s → %s:%d", s.ID, d.ID, port.Number)
				if s.Cluster != d.Cluster {
					// No VirtualMesh: no route between the clusters. The
					// audit lists no such pair, and a call naming the
					// other cluster's Service fails.
					assert.False(t, allowed[pair], "%s: the audit allows a pair without a route", pair)
					remote++
					continue
				}
				local++
				got := callPair(t, w, d.Service, port.Number)
				assert.Equal(t, allowed[pair], got, "%s: the audit says allowed=%t, %d counted RPCs say allowed=%t", pair, allowed[pair], auditBatch, got)
			}
		}
	}
	// Cross-cluster: the other cluster's federated host is unknown to a
	// client's istiod, so every call fails.
	for _, w := range []*dataplane.Workload{f.sleep, f.sleep2} {
		other := map[*dataplane.Workload]string{f.sleep: "cluster-2", f.sleep2: "cluster-1"}[w]
		c, err := w.DialHost("echo.apps.svc."+other+".global", echoPort)
		require.NoError(t, err)
		o := run(t, c, auditProbe, dataplane.CallOptions{Timeout: remoteTimeout})
		assert.Zero(t, o.Code(codes.OK), "%s → echo of %s: no route, yet calls succeed", w.Name(), other)
		require.NoError(t, c.Close())
	}
	assert.Equal(t, 14, local, "7 identities × their cluster's 2 Services")
	assert.Equal(t, 14, remote)
	assert.Len(t, res.Matrix.Pairs, 11, "cluster-1: sleep to echo, all 4 to ping; cluster-2: all 3 to both")
}

// callPair calls service from w until the outcome is settled (every call
// of a probe OK, or every one denied by the servers' RBAC), then counts a
// batch: true when every call succeeds, false when every one is denied; a
// mix fails the test.
func callPair(t *testing.T, w *dataplane.Workload, service string, port int32) bool {
	t.Helper()
	c, err := w.Dial(service, ns, port)
	require.NoError(t, err)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), settle)
	defer cancel()
	var last *dataplane.Outcomes
	for ctx.Err() == nil {
		o, err := c.Run(ctx, auditProbe, dataplane.CallOptions{})
		require.NoError(t, err)
		if o.Code(codes.OK) == o.Total() || o.Code(codes.PermissionDenied) == o.Total() {
			break
		}
		last = o
		time.Sleep(100 * time.Millisecond)
	}
	require.NoError(t, ctx.Err(), "%s → %s: no settled outcome within %s; last probe: %v", w.Name(), service, settle, last)
	o := run(t, c, auditBatch, dataplane.CallOptions{})
	switch {
	case o.Code(codes.OK) == auditBatch:
		return true
	case o.Code(codes.PermissionDenied) == auditBatch:
		return false
	}
	require.Failf(t, "mixed outcome", "%s → %s: %v", w.Name(), service, o)
	return false
}
