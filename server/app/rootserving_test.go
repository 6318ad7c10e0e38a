package app_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/server/app/apptest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A relay root rotation stepped to Switching makes the replica serve a
// certificate under the new root within its issuer check interval, with
// the new issuing CA also cross-issued by the old root (an agent that
// missed the new root still verifies it), and only a pool of the new root
// verifies it once the old root leaves: an agent that stored the bundle
// keeps verifying the server through the switch and after it.
func TestServingCertificateFollowsTheRootRotationsSwitch(t *testing.T) {
	ctx := context.Background()
	ns := "root-serving"
	kube := apptest.Management(t, ns)
	cfg := apptest.AppConfig(t, ns, "replica-0")
	cfg.CA.IssuerCheck = time.Second
	a := apptest.StartApp(t, kube, cfg)

	served := func() []*x509.Certificate {
		conn, err := tls.Dial("tcp", a.Addrs.Relay, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}) //nolint:gosec // the test inspects the chain itself
		require.NoError(t, err)
		defer func() { _ = conn.Close() }()
		return conn.ConnectionState().PeerCertificates
	}
	verifiesWith := func(chain []*x509.Certificate, roots ...*x509.Certificate) bool {
		pool, inter := x509.NewCertPool(), x509.NewCertPool()
		for _, r := range roots {
			pool.AddCert(r)
		}
		for _, c := range chain[1:] {
			inter.AddCert(c)
		}
		_, err := chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		return err == nil
	}
	rootOf := func(key string) *x509.Certificate {
		s, err := kube.Typed.CoreV1().Secrets(ns).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
		require.NoError(t, err)
		roots, err := ca.ParseTrustBundle(s.Data[key])
		require.NoError(t, err)
		return roots[0]
	}
	oldRoot := rootOf("ca.crt")
	require.True(t, verifiesWith(served(), oldRoot))

	now := time.Now()
	stepCfg := ca.RootStepConfig{CA: ca.GenerateConfig{Clock: func() time.Time { return now }}, Rotation: ca.RootRotationConfig{Grace: time.Minute}}
	// No agent is registered: every replica's loaded revision is what the
	// Secret says, once this replica loaded it.
	observe := func(_ context.Context, st ca.RootRotationState) ([]ca.AgentRootObservation, int, error) {
		return nil, st.Revision, nil
	}
	step := func() ca.RootDecision {
		// The replica writes the signing Secret too (its issuer checks,
		// every second here): a step that meets one of its writes is
		// refused as a conflict and taken again on what is there now, as
		// the Lease holder's own stepping does at its next tick.
		for attempt := 0; ; attempt++ {
			d, err := ca.StepRootRotation(ctx, kube.Typed, ns, stepCfg, observe)
			if apierrors.IsConflict(err) && attempt < 5 {
				continue
			}
			require.NoError(t, err)
			return d
		}
	}
	require.NoError(t, ca.RequestRootRotation(ctx, kube.Typed, ns, ca.RootRequestStart))
	step()
	// The replica's own relay-root-rotation task steps too (the request
	// kicks it, and with no agent registered nothing holds AddingNewRoot
	// once the replica loaded it): the rotation is in AddingNewRoot or
	// already past it (a clean-clone make test met the latter). Either
	// way the old root still verifies what is served below.
	require.Contains(t, []ca.RootPhase{ca.RootAddingNew, ca.RootSwitching}, step().State.Phase)
	newRoot := rootOf("next.crt")
	time.Sleep(3 * cfg.CA.IssuerCheck) // the replica loads AddingNewRoot
	assert.True(t, verifiesWith(served(), oldRoot), "AddingNewRoot: still served under the old root")

	require.Equal(t, ca.RootSwitching, step().State.Phase)
	require.Eventually(t, func() bool { return verifiesWith(served(), newRoot) }, time.Minute, 200*time.Millisecond,
		"Switching: the replica serves under the new root")
	chain := served()
	assert.Len(t, chain, 3, "Switching: leaf, the new issuing CA, and the same CA cross-issued by the old root")
	assert.True(t, verifiesWith(chain, oldRoot), "an agent pinning only the old root verifies it through the cross-issued CA")
	assert.False(t, verifiesWith(chain[:2], oldRoot), "and would not without it")

	now = now.Add(2 * time.Minute)
	require.Equal(t, ca.RootRemovingOld, step().State.Phase)
	require.Eventually(t, func() bool { return len(served()) == 2 }, time.Minute, 200*time.Millisecond,
		"RemovingOldRoot: the cross-issued CA leaves the chain with the old root")
	assert.False(t, verifiesWith(served(), oldRoot))
	require.Equal(t, ca.RootIdle, step().State.Phase)
	time.Sleep(3 * cfg.CA.IssuerCheck)
	assert.True(t, verifiesWith(served(), newRoot), "Idle: served under the new root, the relay root now")
	assert.Contains(t, a.Logs.String(), "renewed the serving certificate for the relay CA's new chain")
}
