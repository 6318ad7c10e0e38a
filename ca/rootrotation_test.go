package ca

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRootRotationDecidesEveryPhaseRollbackAndResume(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	cfg := RootRotationConfig{Grace: 25 * time.Hour}
	both := BundleFingerprint([]string{"old", "new"})
	onlyNew := BundleFingerprint([]string{"new"})
	idle := RootRotationState{Phase: RootIdle, Old: "old", Revision: 3}
	adding := RootRotationState{Phase: RootAddingNew, Old: "old", New: "new", Since: t0, Revision: 4}
	switching := RootRotationState{Phase: RootSwitching, Old: "old", New: "new", Since: t0, Revision: 5}
	removing := RootRotationState{Phase: RootRemovingOld, Old: "old", New: "new", Since: t0, Revision: 6}
	young := RootObservations{RootNotBefore: t0.AddDate(-1, 0, 0), RootNotAfter: t0.AddDate(9, 0, 0)}
	with := func(o RootObservations, f func(*RootObservations)) RootObservations { f(&o); return o }
	agent := func(name, acked, onRoot string) AgentRootObservation {
		return AgentRootObservation{Cluster: name, Connected: true, CanAcknowledge: true, Acked: acked, OnRoot: onRoot}
	}

	tests := []struct {
		name      string
		st        RootRotationState
		obs       RootObservations
		now       time.Time
		want      RootRotationState
		actions   []RootAction
		waiting   string // substring of Waiting; "" means none
		blocking  []string
		refused   string
		postponed string // substring of Postponed; "" means none
		wantState bool   // want is checked (else: unchanged)
	}{
		{name: "idle with a young root does nothing", st: idle, obs: young, now: t0},
		{name: "a start request stages a new root first", st: idle, obs: with(young, func(o *RootObservations) { o.Request = RootRequestStart }), now: t0,
			actions: []RootAction{RootActStage}, waiting: "staging"},
		{name: "a start request with a staged root enters AddingNewRoot and is consumed",
			st: idle, obs: with(young, func(o *RootObservations) { o.Request = RootRequestStart; o.Staged = "new" }), now: t0,
			want: adding, wantState: true, actions: []RootAction{RootActClearRequest}},
		{name: "a root past 2/3 of its life starts a rotation by itself",
			st: idle, obs: RootObservations{RootNotBefore: t0.AddDate(-7, 0, 0), RootNotAfter: t0.AddDate(3, 0, 0)}, now: t0,
			actions: []RootAction{RootActStage}, waiting: "staging"},
		{name: "a staged root nobody asked for (a step left unfinished) is discarded",
			st: idle, obs: with(young, func(o *RootObservations) { o.Staged = "new" }), now: t0, actions: []RootAction{RootActDiscard}},
		{name: "a rollback request in Idle is refused and consumed",
			st: idle, obs: with(young, func(o *RootObservations) { o.Request = RootRequestRollback }), now: t0,
			actions: []RootAction{RootActClearRequest}, refused: "nothing to roll back"},

		{name: "AddingNewRoot waits for every replica to load it",
			st: adding, obs: RootObservations{LoadedRevision: 3}, now: t0, waiting: "revision 3, not yet 4"},
		{name: "AddingNewRoot waits for a connected agent that has not acknowledged",
			st: adding, obs: RootObservations{LoadedRevision: 4, Agents: []AgentRootObservation{agent("a", both, "old"), agent("b", "", "old")}}, now: t0,
			waiting: "1 connected agents", blocking: []string{"b: has not acknowledged yet"}},
		{name: "an agent that cannot acknowledge is listed, never counted as acknowledged",
			st: adding, obs: RootObservations{LoadedRevision: 4, Agents: []AgentRootObservation{{Cluster: "legacy", Connected: true, OnRoot: "old"}}}, now: t0,
			waiting: "1 connected agents", blocking: []string{"legacy: its agent cannot acknowledge trust bundles (upgrade it)"}},
		{name: "an agent that acknowledged another bundle is still waited for",
			st: adding, obs: RootObservations{LoadedRevision: 4, Agents: []AgentRootObservation{agent("a", onlyNew, "old")}}, now: t0,
			blocking: []string{"a: has not acknowledged yet"}, waiting: "acknowledged"},
		{name: "every connected agent acknowledged: Switching (offline agents do not block)",
			st: adding, obs: RootObservations{LoadedRevision: 4, Agents: []AgentRootObservation{agent("a", both, "old"), {Cluster: "off"}}}, now: t0.Add(time.Minute),
			want: RootRotationState{Phase: RootSwitching, Old: "old", New: "new", Since: t0.Add(time.Minute), Revision: 5}, wantState: true},
		{name: "a second start request during a rotation is refused and consumed",
			st: adding, obs: RootObservations{Request: RootRequestStart, LoadedRevision: 3}, now: t0,
			actions: []RootAction{RootActClearRequest}, refused: "already in progress", waiting: "not yet 4"},
		{name: "rollback from AddingNewRoot discards the new root at once",
			st: adding, obs: RootObservations{Request: RootRequestRollback, LoadedRevision: 2}, now: t0.Add(time.Minute),
			want: RootRotationState{Phase: RootIdle, Old: "old", Since: t0.Add(time.Minute), Revision: 5, RolledBack: true}, wantState: true,
			actions: []RootAction{RootActClearRequest, RootActDiscard}},

		{name: "Switching keeps both roots for the grace window",
			st: switching, obs: RootObservations{LoadedRevision: 5}, now: t0.Add(24 * time.Hour), waiting: "until 2030-01-02T01:00:00Z"},
		{name: "Switching waits for a connected agent still under the old root after the grace",
			st: switching, obs: RootObservations{LoadedRevision: 5, Agents: []AgentRootObservation{agent("a", both, "new"), agent("b", both, "old")}}, now: t0.Add(26 * time.Hour),
			waiting: "renewed under the new root", blocking: []string{"b: still authenticates with a certificate under the old root"}},
		{name: "Switching after the grace with every agent under the new root: RemovingOldRoot",
			st: switching, obs: RootObservations{LoadedRevision: 5, Agents: []AgentRootObservation{agent("a", both, "new"), {Cluster: "off", OnRoot: "old"}}}, now: t0.Add(26 * time.Hour),
			want: RootRotationState{Phase: RootRemovingOld, Old: "old", New: "new", Since: t0.Add(26 * time.Hour), Revision: 6}, wantState: true},
		{name: "rollback from Switching issues from the old root again and keeps the new one for a grace window",
			st: switching, obs: RootObservations{Request: RootRequestRollback}, now: t0.Add(time.Hour),
			want: RootRotationState{Phase: RootSwitching, Old: "new", New: "old", Since: t0.Add(time.Hour), Revision: 6, RolledBack: true}, wantState: true,
			actions: []RootAction{RootActClearRequest}},

		{name: "RemovingOldRoot waits for the bundle without the old root to be acknowledged",
			st: removing, obs: RootObservations{LoadedRevision: 6, Agents: []AgentRootObservation{agent("a", both, "new")}}, now: t0,
			waiting: "without the old root", blocking: []string{"a: has not acknowledged yet"}},
		{name: "RemovingOldRoot acknowledged everywhere: Idle on the new root, old keys deleted",
			st: removing, obs: RootObservations{LoadedRevision: 6, Agents: []AgentRootObservation{agent("a", onlyNew, "new")}}, now: t0.Add(time.Hour),
			want: RootRotationState{Phase: RootIdle, Old: "new", Since: t0.Add(time.Hour), Revision: 7}, wantState: true,
			actions: []RootAction{RootActDeleteOld}},
		{name: "rollback from RemovingOldRoot delivers the old root again before anything switches back",
			st: removing, obs: RootObservations{Request: RootRequestRollback}, now: t0.Add(time.Hour),
			want: RootRotationState{Phase: RootAddingNew, Old: "new", New: "old", Since: t0.Add(time.Hour), Revision: 7, RolledBack: true}, wantState: true,
			actions: []RootAction{RootActClearRequest}},

		// The staged root's issuing CA ages with the rotation.
		{name: "a due staged issuing CA is renewed in AddingNewRoot while agents are waited for",
			st: adding, obs: RootObservations{Staged: "new", StagedIssuerDue: true, LoadedRevision: 4, Agents: []AgentRootObservation{agent("b", "", "old")}}, now: t0,
			actions: []RootAction{RootActRenewStagedIssuer}, waiting: "1 connected agents", blocking: []string{"b: has not acknowledged yet"}},
		{name: "a due staged issuing CA is renewed in Switching, even while replicas load, and the phase still moves",
			st: switching, obs: RootObservations{Staged: "new", StagedIssuerDue: true, StagedIssuersKept: 3, LoadedRevision: 5, Agents: []AgentRootObservation{agent("a", both, "new")}}, now: t0.Add(26 * time.Hour),
			want: RootRotationState{Phase: RootRemovingOld, Old: "old", New: "new", Since: t0.Add(26 * time.Hour), Revision: 6}, wantState: true,
			actions: []RootAction{RootActRenewStagedIssuer}},
		{name: "a due staged issuing CA is renewed in RemovingOldRoot",
			st: removing, obs: RootObservations{Staged: "new", StagedIssuerDue: true, LoadedRevision: 5}, now: t0,
			actions: []RootAction{RootActRenewStagedIssuer}, waiting: "revision 5, not yet 6"},
		{name: "a staged issuing CA with four replaced ones still accepted is not renewed: postponed, said why",
			st: switching, obs: RootObservations{Staged: "new", StagedIssuerDue: true, StagedIssuersKept: 4, LoadedRevision: 5}, now: t0,
			waiting: "both roots stay accepted", postponed: "4 issuing CAs it replaced are still accepted, at most 4"},
		{name: "after a rollback the staged root only leaves, but replicas load it until then: its issuing CA is renewed too",
			st:  RootRotationState{Phase: RootSwitching, Old: "new", New: "old", Since: t0, Revision: 6, RolledBack: true},
			obs: RootObservations{Staged: "new", StagedIssuerDue: true, LoadedRevision: 6}, now: t0, waiting: "both roots stay accepted",
			actions: []RootAction{RootActRenewStagedIssuer}},
		{name: "a rollback is never held up by a due staged issuing CA",
			st: switching, obs: RootObservations{Request: RootRequestRollback, Staged: "new", StagedIssuerDue: true}, now: t0,
			want: RootRotationState{Phase: RootSwitching, Old: "new", New: "old", Since: t0, Revision: 6, RolledBack: true}, wantState: true,
			actions: []RootAction{RootActClearRequest}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := NextRootRotation(cfg, tt.st, tt.obs, tt.now)
			if err != nil {
				t.Fatal(err)
			}
			want := tt.st
			if tt.wantState {
				want = tt.want
				want.Grace = cfg.Grace // every transition records the deciding server's grace
			}
			if d.State != want {
				t.Errorf("state = %+v, want %+v", d.State, want)
			}
			if !slices.Equal(d.Actions, tt.actions) {
				t.Errorf("actions = %v, want %v", d.Actions, tt.actions)
			}
			if (tt.waiting == "") != (d.Waiting == "") || !strings.Contains(d.Waiting, tt.waiting) {
				t.Errorf("waiting = %q, want it to contain %q", d.Waiting, tt.waiting)
			}
			if !slices.Equal(d.Blocking, tt.blocking) {
				t.Errorf("blocking = %q, want %q", d.Blocking, tt.blocking)
			}
			if (tt.refused == "") != (d.Refused == "") || !strings.Contains(d.Refused, tt.refused) {
				t.Errorf("refused = %q, want it to contain %q", d.Refused, tt.refused)
			}
			if (tt.postponed == "") != (d.Postponed == "") || !strings.Contains(d.Postponed, tt.postponed) {
				t.Errorf("postponed = %q, want it to contain %q", d.Postponed, tt.postponed)
			}
			if err := d.State.Validate(); err != nil {
				t.Errorf("decided an invalid state: %v", err)
			}
		})
	}
}

// A whole rotation, then a replica killed after every write: the next
// Lease holder, deciding again from the written state with the same
// observations, decides the same thing, and nothing is done twice that
// is not idempotent.
func TestRootRotationResumesFromEveryWrittenStateAfterACrash(t *testing.T) {
	cfg := RootRotationConfig{Grace: time.Hour}
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	st := RootRotationState{Phase: RootIdle, Old: "old", Revision: 1}
	obs := RootObservations{Request: RootRequestStart, LoadedRevision: 1}
	var phases []RootPhase
	for step := 0; step < 20 && !(st.Phase == RootIdle && st.Old == "new"); step++ {
		d, err := NextRootRotation(cfg, st, obs, now)
		if err != nil {
			t.Fatal(err)
		}
		// The replica dies right after writing d: its successor decides
		// from d.State with what it observes, which is the same world.
		again, err := NextRootRotation(cfg, st, obs, now)
		if err != nil {
			t.Fatal(err)
		}
		if again.State != d.State || !slices.Equal(again.Actions, d.Actions) {
			t.Fatalf("step %d: a second decision from the same state differs: %+v vs %+v", step, again, d)
		}
		// Perform the actions on the observed world.
		for _, a := range d.Actions {
			switch a {
			case RootActStage:
				obs.Staged = "new"
			case RootActClearRequest:
				obs.Request = RootRequestNone
			case RootActDiscard, RootActDeleteOld:
				obs.Staged = ""
			}
		}
		if d.Moved(st) {
			phases = append(phases, d.State.Phase)
		}
		st = d.State
		// Replicas load it, the agent acknowledges and renews.
		obs.LoadedRevision = st.Revision
		eff := st.Effective()
		obs.Agents = []AgentRootObservation{{Cluster: "a", Connected: true, CanAcknowledge: true, Acked: BundleFingerprint(eff.Bundle), OnRoot: eff.IssueFrom}}
		now = now.Add(30 * time.Minute)
	}
	want := []RootPhase{RootAddingNew, RootSwitching, RootRemovingOld, RootIdle}
	if !slices.Equal(phases, want) || st.Old != "new" || st.New != "" {
		t.Fatalf("phases %v ending in %+v, want %v ending on the new root", phases, st, want)
	}
}

func TestRootRotationRefusesAStateThatMakesNoSense(t *testing.T) {
	cfg := RootRotationConfig{Grace: time.Hour}
	for _, st := range []RootRotationState{
		{},
		{Phase: RootIdle, Old: "a", New: "b"},
		{Phase: RootAddingNew, Old: "a"},
		{Phase: RootSwitching, Old: "a", New: "a"},
		{Phase: "Sideways", Old: "a", New: "b"},
		{Phase: RootIdle, Old: "a", Revision: -1},
	} {
		if _, err := NextRootRotation(cfg, st, RootObservations{}, time.Now()); !errors.Is(err, ErrRootRotationState) {
			t.Errorf("%+v: err = %v, want ErrRootRotationState", st, err)
		}
	}
	if _, err := NextRootRotation(RootRotationConfig{}, RootRotationState{Phase: RootIdle, Old: "a"}, RootObservations{}, time.Now()); err == nil {
		t.Error("a config without a grace window was accepted")
	}
}

func TestRootRotationEffectKeepsOneRootInCommonAcrossEveryStep(t *testing.T) {
	// An agent that pinned the bundle of one phase must verify a server of
	// the next: consecutive bundles always share a root, and the root
	// issued from is in the accepted set and the bundle.
	seq := []RootRotationState{
		{Phase: RootIdle, Old: "old"},
		{Phase: RootAddingNew, Old: "old", New: "new"},
		{Phase: RootSwitching, Old: "old", New: "new"},
		{Phase: RootRemovingOld, Old: "old", New: "new"},
		{Phase: RootIdle, Old: "new"},
	}
	for i, st := range seq {
		e := st.Effective()
		if !slices.Contains(e.Bundle, e.IssueFrom) || !slices.Contains(e.Accepted, e.IssueFrom) {
			t.Errorf("%s: issues from %s outside bundle %v or accepted %v", st.Phase, e.IssueFrom, e.Bundle, e.Accepted)
		}
		if i > 0 {
			prev := seq[i-1].Effective()
			if !slices.ContainsFunc(prev.Bundle, func(r string) bool { return slices.Contains(e.Bundle, r) }) {
				t.Errorf("%s → %s: bundles %v and %v share no root", seq[i-1].Phase, st.Phase, prev.Bundle, e.Bundle)
			}
			if !slices.Contains(prev.Bundle, e.IssueFrom) && !e.CrossSign {
				t.Errorf("%s: issues from %s, which agents of the previous phase do not pin", st.Phase, e.IssueFrom)
			}
		}
	}
	if BundleFingerprint([]string{"a", "b"}) != BundleFingerprint([]string{"b", "a", "a"}) || BundleFingerprint([]string{"a"}) == BundleFingerprint([]string{"a", "b"}) {
		t.Error("a bundle's fingerprint depends on order or duplicates, or two sets share one")
	}
}

// Manual (--relay-root-renew-at 0): a root past due starts nothing by
// itself; an operator's request starts a rotation, and one in progress
// goes on as it would otherwise.
func TestManualRootRotationStartsOnlyOnRequest(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	cfg := RootRotationConfig{Grace: 25 * time.Hour, Manual: true}
	idle := RootRotationState{Phase: RootIdle, Old: "old", Revision: 3}
	due := RootObservations{RootNotBefore: t0.AddDate(-9, 0, 0), RootNotAfter: t0.AddDate(1, 0, 0)}

	d, err := NextRootRotation(cfg, idle, due, t0)
	require.NoError(t, err)
	assert.Equal(t, idle, d.State, "a root past due starts nothing")
	assert.Empty(t, d.Actions)

	due.Request = RootRequestStart
	d, err = NextRootRotation(cfg, idle, due, t0)
	require.NoError(t, err)
	assert.Equal(t, []RootAction{RootActStage}, d.Actions, "a request does")

	adding := RootRotationState{Phase: RootAddingNew, Old: "old", New: "new", Since: t0, Revision: 4}
	acked := RootObservations{LoadedRevision: 4, Agents: []AgentRootObservation{{Cluster: "a", Connected: true, CanAcknowledge: true,
		Acked: BundleFingerprint([]string{"old", "new"})}}}
	d, err = NextRootRotation(cfg, adding, acked, t0)
	require.NoError(t, err)
	assert.Equal(t, RootSwitching, d.State.Phase, "a rotation in progress goes on")
}
