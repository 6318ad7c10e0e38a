package fleet_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/test/fleet"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFleetLifetimeLosesNoAgentThroughRenewalsARootRotationAndAKill is
// issue 30's "years compressed into minutes" at CI size: 30 agents with the
// real credential manager on 3 replicas whose agent certificates live a
// minute and whose issuing CA lives 160 s (renewed at half its life),
// through two issuing-CA renewals and a relay root rotation started by
// `relaymesh ca relay rotate start`, with the Lease holder SIGKILLed in
// Switching: no agent is lost, no Renew is refused, no agent needs a new
// token, the rotation ends at Idle under the new root and every agent pins
// the new root alone.
func TestFleetLifetimeLosesNoAgentThroughRenewalsARootRotationAndAKill(t *testing.T) {
	env := startEnv(t)
	r, err := fleet.Lifetime(context.Background(), fleet.LifetimeConfig{
		Options: fleet.Options{Env: env, Logf: t.Logf}, Agents: 30, Timeout: 6 * time.Minute,
	})
	if r != nil {
		js, _ := json.MarshalIndent(r, "", "  ")
		t.Logf("%s", js)
	}
	require.NoError(t, err)

	assert.Zero(t, r.Lost, "agents lost: %v", r.LostExamples)
	assert.Zero(t, r.RefusedSessions, "sessions refused")
	assert.Zero(t, r.RefusedRenews, "Renew calls refused by a replica")
	assert.Zero(t, r.ReBootstraps, "agents that needed a new token")
	assert.GreaterOrEqual(t, r.IssuerRenewals, 2, "issuing CA renewals: %+v", r.Issuers)
	assert.True(t, r.RotationDone, "rotation back at Idle under a new root: %v", r.Phases)
	assert.NotEqual(t, r.OldRoot, r.NewRoot)
	assert.Equal(t, []ca.RootPhase{ca.RootIdle, ca.RootAddingNew, ca.RootSwitching, ca.RootRemovingOld, ca.RootIdle}, r.Phases)
	assert.Equal(t, ca.RootSwitching, r.KilledIn)
	assert.True(t, r.KilledLeader)
	assert.Positive(t, r.KilledSessions, "the killed Lease holder held sessions")
	assert.Equal(t, r.Agents, r.PinnedNewRoot, "agents pinning the new root alone")
	// Each agent renewed by itself, under both roots: more than the two
	// renewals a 60 s certificate needs across the rotation's grace.
	assert.GreaterOrEqual(t, r.MinRenewals, 3, "the fewest renewals of one agent")
	// Each agent stored the two-root bundle, then the new root alone.
	assert.GreaterOrEqual(t, r.BundlesPinned, 2*r.Agents)
	assert.Zero(t, r.BundlesRefused)
	assert.Zero(t, r.Regressions)
	assert.Empty(t, r.Leaks, "no token or private key in any replica's logs")
	for _, rep := range r.Replica {
		assert.Empty(t, rep.AuditError, "audit chain of %s", rep.Name)
	}
}
