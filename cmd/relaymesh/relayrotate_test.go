package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/server/app"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestRelayRotateRefusesBadArguments(t *testing.T) {
	ctx := context.Background()
	for _, args := range [][]string{
		{"ca", "relay"},
		{"ca", "relay", "spin"},
		{"ca", "relay", "rotate"},
		{"ca", "relay", "rotate", "spin"},
		{"ca", "relay", "rotate", "start", "extra"},
		{"ca", "relay", "rotate", "rollback", "extra"},
		{"ca", "relay", "rotate", "status", "-o", "xml"},
	} {
		var out, errOut bytes.Buffer
		assert.NotEqual(t, 0, run(ctx, args, &out, &errOut), "%v", args)
		assert.Empty(t, out.String(), "%v", args)
	}
}

// A request is refused, with what to do, when it makes no sense in the
// state the Secret holds.
func TestRelayRotateRequestRefusals(t *testing.T) {
	idle := ca.RootRotationState{Phase: ca.RootIdle, Old: "o"}
	adding := ca.RootRotationState{Phase: ca.RootAddingNew, Old: "o", New: "n", Revision: 1}
	for _, tc := range []struct {
		name    string
		st      ca.RootRotationState
		pending ca.RootRequest
		req     ca.RootRequest
		want    string
	}{
		{"start when idle", idle, "", ca.RootRequestStart, ""},
		{"rollback in progress", adding, "", ca.RootRequestRollback, ""},
		{"start in progress", adding, "", ca.RootRequestStart, "already in progress (phase AddingNewRoot"},
		{"rollback when idle", idle, "", ca.RootRequestRollback, "nothing to roll back"},
		{"a request pending", idle, ca.RootRequestStart, ca.RootRequestStart, "already pending"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := requestRefusal(tc.st, tc.pending, tc.req)
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// Status lists the relay-mode clusters that have not acknowledged this
// phase's bundle, connected ones first, each with why, and says what
// happens next.
func TestRelayRootStatusListsWhoHasNotAcknowledged(t *testing.T) {
	rc, err := ca.GenerateRelayCA(ca.GenerateConfig{})
	require.NoError(t, err)
	next, err := ca.GenerateRelayCA(ca.GenerateConfig{})
	require.NoError(t, err)
	st := ca.RootRotationState{Phase: ca.RootAddingNew, Old: ca.RootFingerprint(rc.Root), New: ca.RootFingerprint(next.Root), Revision: 1,
		Since: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)}
	bundle := ca.BundleFingerprint(st.Effective().Bundle)
	kc := func(name string, mode multiclusterv1alpha1.RegistrationMode, connected bool, ann map[string]string) multiclusterv1alpha1.KubernetesCluster {
		c := multiclusterv1alpha1.KubernetesCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann}}
		c.Spec.Mode, c.Status.Connected = mode, connected
		return c
	}
	clusters := []multiclusterv1alpha1.KubernetesCluster{
		kc("z-offline", multiclusterv1alpha1.ModeRelay, false, nil),
		kc("done", multiclusterv1alpha1.ModeRelay, true, map[string]string{app.AnnotationBundleAck: bundle}),
		kc("kubeconfig", multiclusterv1alpha1.ModeKubeconfig, true, nil),
		kc("old-agent", multiclusterv1alpha1.ModeRelay, true, map[string]string{app.AnnotationBundleRefused: bundle[:8] + ": " + app.BundleCannotAck}),
		kc("b-slow", multiclusterv1alpha1.ModeRelay, true, map[string]string{app.AnnotationBundleAck: "an-older-bundle"}),
	}
	s := relayRootStatusOf(st, ca.RootRequestNone, rc.Root, next.Root, clusters)
	require.NotNil(t, s.OldRoot)
	require.NotNil(t, s.NewRoot)
	assert.Equal(t, st.Old, s.OldRoot.Fingerprint)
	assert.Equal(t, st.New, s.NewRoot.Fingerprint)
	assert.Equal(t, next.Root.NotAfter.UTC(), s.NewRoot.NotAfter)
	assert.Equal(t, bundle, s.Bundle)
	var names []string
	for _, a := range s.Agents {
		names = append(names, a.Cluster)
	}
	assert.Equal(t, []string{"b-slow", "old-agent", "z-offline"}, names)
	assert.Contains(t, s.Agents[1].Reason, app.BundleCannotAck)
	assert.Contains(t, s.Agents[2].Reason, "offline")
	assert.Contains(t, s.Next, "(3 clusters have not)")

	var out bytes.Buffer
	require.NoError(t, writeRelayRootStatus(&out, s))
	for _, want := range []string{"PHASE AddingNewRoot  REVISION 1  SINCE 2026-12-02T10:00:00Z", "OLD ROOT  " + st.Old, "NEW ROOT  " + st.New,
		"NOT ACKNOWLEDGED  b-slow  has not acknowledged yet", "NEXT  every connected agent"} {
		assert.Contains(t, out.String(), want)
	}

	idle := relayRootStatusOf(ca.RootRotationState{Phase: ca.RootIdle, Old: st.Old}, ca.RootRequestStart, rc.Root, nil, clusters)
	assert.Empty(t, idle.Agents, "nothing to acknowledge while idle")
	assert.Nil(t, idle.NewRoot)
	assert.Contains(t, idle.Next, "pending start request")
}

// Every phase says what comes next.
func TestRelayRootNextNamesTheNextPhase(t *testing.T) {
	for phase, want := range map[ca.RootPhase]string{ca.RootIdle: "relaymesh ca relay rotate start", ca.RootAddingNew: "(Switching)",
		ca.RootSwitching: "(RemovingOldRoot)", ca.RootRemovingOld: "(Idle)"} {
		assert.Contains(t, ca.RootRotationNext(ca.RootRotationState{Phase: phase}, ca.RootRequestNone, 0), want, phase)
	}
}

// Against a real apiserver: without a relay root Secret every verb says
// so; with one, start records the request once (a second start and a
// rollback are refused while it is pending, and change nothing), status
// shows it, and rollback when idle is refused.
func TestRelayRotateAgainstAPIServer(t *testing.T) {
	ctx := context.Background()
	mgmt, kube, _ := localcluster.Management(t, "relaymesh")
	cli := func(args ...string) (string, string, int) {
		var out, errOut bytes.Buffer
		code := run(ctx, append(append([]string{"ca", "relay", "rotate"}, args...), "--kubeconfig", mgmt.Kubeconfig), &out, &errOut)
		return out.String(), errOut.String(), code
	}
	for _, verb := range []string{"start", "status", "rollback"} {
		_, errOut, code := cli(verb)
		assert.NotEqual(t, 0, code, verb)
		assert.Contains(t, errOut, "no relay root Secret relaymesh/relay-root-tls-secret", verb)
	}
	_, err := ca.LoadOrCreateRelayCA(ctx, kube, "relaymesh", ca.GenerateConfig{})
	require.NoError(t, err)
	secret := func() map[string]string {
		s, err := kube.CoreV1().Secrets("relaymesh").Get(ctx, ca.RootSecretName, metav1.GetOptions{})
		require.NoError(t, err)
		return s.Annotations
	}

	_, errOut, code := cli("rollback")
	assert.NotEqual(t, 0, code)
	assert.Contains(t, errOut, "nothing to roll back")
	assert.NotContains(t, secret(), ca.AnnotationRootRequest)

	out, errOut, code := cli("start")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "requested: relay root rotation start")
	assert.Equal(t, "start", secret()[ca.AnnotationRootRequest])
	for _, verb := range []string{"start", "rollback"} {
		_, errOut, code = cli(verb)
		assert.NotEqual(t, 0, code, verb)
		assert.Contains(t, errOut, "(start) is already pending", verb)
	}
	assert.Equal(t, "start", secret()[ca.AnnotationRootRequest])

	out, errOut, code = cli("status")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "PHASE Idle  REVISION 0")
	assert.Contains(t, out, "OLD ROOT  ")
	assert.Contains(t, out, "PENDING REQUEST  start")
	out, _, code = cli("status", "-o", "json")
	require.Equal(t, 0, code)
	assert.Contains(t, out, `"pendingRequest": "start"`)
}
