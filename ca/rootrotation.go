package ca

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Relay root rotation as a pure decision (design note
// docs/design/2026-12-02-relay-root-rotation.md): NextRootRotation takes
// the persisted state, what the Lease holder observed and the time, and
// returns the next state and the actions that take the Secrets there. It
// reads and writes nothing; the task that gathers observations and
// performs actions is apart, so every phase, rollback and crash-resume is
// a table test.

// RootPhase is a phase of a relay root rotation.
type RootPhase string

// The phases. What each means for bundles, accepted roots and issuance is
// RootRotationState.Effective.
const (
	RootIdle        RootPhase = "Idle"
	RootAddingNew   RootPhase = "AddingNewRoot"
	RootSwitching   RootPhase = "Switching"
	RootRemovingOld RootPhase = "RemovingOldRoot"
)

// RootRequest is what an operator asked for (relaymesh ca relay rotate).
type RootRequest string

// The requests.
const (
	RootRequestNone     RootRequest = ""
	RootRequestStart    RootRequest = "start"
	RootRequestRollback RootRequest = "rollback"
)

// RootAction is one change the rotation task makes to the relay CA
// Secrets, together with writing the decided state (one Update).
type RootAction string

// The actions. Each is idempotent: re-running the actions of a state
// after a crash is safe.
const (
	// RootActStage makes a new root and an issuing CA under it, staged
	// beside the current one and used by nobody.
	RootActStage RootAction = "StageNewRoot"
	// RootActDiscard deletes the staged root's material.
	RootActDiscard RootAction = "DiscardNewRoot"
	// RootActDeleteOld deletes the replaced root's material; the root of
	// the state's Old is the relay root from then on.
	RootActDeleteOld RootAction = "DeleteOldRoot"
	// RootActClearRequest removes the operator's request: it was acted on
	// or refused (the decision's Refused says why).
	RootActClearRequest RootAction = "ClearRequest"
	// RootActRenewStagedIssuer signs a new issuing CA under the staged
	// root, like the issuing-CA renewal does under the current one. Once
	// the staged root issues (Switching on), the issuing CA it replaces
	// stays accepted until its NotAfter, and moves to the previous issuing
	// CAs when the staged root becomes the root.
	RootActRenewStagedIssuer RootAction = "RenewStagedIssuer"
)

// ErrRootRotationState marks a persisted rotation state that makes no
// sense; nothing is decided from it.
var ErrRootRotationState = errors.New("invalid relay root rotation state")

// RootRotationState is the persisted state of a relay root rotation. Old
// and New are root fingerprints (RootFingerprint); in Idle, Old is the
// relay root and New is empty.
type RootRotationState struct {
	Phase RootPhase
	Old   string
	New   string
	// Since is when Phase was entered.
	Since time.Time
	// Revision is one more at every transition; replicas report the
	// revision they loaded.
	Revision int
	// RolledBack: the roles of Old and New were swapped by a rollback.
	RolledBack bool
	// Grace is the grace of the server that decided the last transition
	// (RootRotationConfig.Grace), for `relaymesh check` and `rotate
	// status`; 0 when unknown (a state written by an older server). The
	// decision itself always uses its own config's.
	Grace time.Duration
}

// Validate reports whether s is a state NextRootRotation can decide from.
func (s RootRotationState) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrRootRotationState, fmt.Sprintf(format, a...))
	}
	switch {
	case s.Old == "":
		return bad("no current root")
	case s.Revision < 0:
		return bad("revision %d", s.Revision)
	}
	switch s.Phase {
	case RootIdle:
		if s.New != "" {
			return bad("phase %s with a new root", s.Phase)
		}
	case RootAddingNew, RootSwitching, RootRemovingOld:
		if s.New == "" || s.New == s.Old {
			return bad("phase %s without a distinct new root", s.Phase)
		}
	default:
		return bad("unknown phase %q", s.Phase)
	}
	return nil
}

// RootEffect is what every replica derives from a state.
type RootEffect struct {
	// Bundle is the roots agents must pin, by fingerprint.
	Bundle []string
	// Accepted are the roots agent certificates may chain to.
	Accepted []string
	// IssueFrom is the root whose issuing CA signs agent certificates and
	// the serving certificate.
	IssueFrom string
	// CrossSign: the serving chain carries IssueFrom cross-signed by the
	// other root, so an agent that still pins only that one verifies it.
	CrossSign bool
}

// Effective is what s means for bundles, accepted roots and issuance.
func (s RootRotationState) Effective() RootEffect {
	switch s.Phase {
	case RootAddingNew:
		return RootEffect{Bundle: []string{s.Old, s.New}, Accepted: []string{s.Old, s.New}, IssueFrom: s.Old}
	case RootSwitching:
		return RootEffect{Bundle: []string{s.Old, s.New}, Accepted: []string{s.Old, s.New}, IssueFrom: s.New, CrossSign: true}
	case RootRemovingOld:
		return RootEffect{Bundle: []string{s.New}, Accepted: []string{s.New}, IssueFrom: s.New}
	default:
		return RootEffect{Bundle: []string{s.Old}, Accepted: []string{s.Old}, IssueFrom: s.Old}
	}
}

// BundleFingerprint names a set of roots by their fingerprints: the same
// set in any order has the same name. Agents acknowledge it.
func BundleFingerprint(roots []string) string {
	s := slices.Clone(roots)
	slices.Sort(s)
	s = slices.Compact(s)
	h := sha256.Sum256([]byte(strings.Join(s, ",")))
	return hex.EncodeToString(h[:])
}

// AgentRootObservation is what the Lease holder knows of one registered
// cluster's agent.
type AgentRootObservation struct {
	Cluster string
	// Connected: it holds a session on a live replica.
	Connected bool
	// CanAcknowledge: its Hello said it handles trust bundles. An agent
	// that cannot is never counted as having acknowledged.
	CanAcknowledge bool
	// Acked is the bundle fingerprint it last acknowledged.
	Acked string
	// OnRoot is the root its session's certificate chains to.
	OnRoot string
}

// RootObservations is what the Lease holder gathered for one decision.
type RootObservations struct {
	Request RootRequest
	// RootNotBefore and RootNotAfter are the current root's (Old's).
	RootNotBefore, RootNotAfter time.Time
	// Staged is the fingerprint of a staged new root, if there is one.
	Staged string
	// StagedIssuerDue: the staged root's issuing CA is past its renewal
	// time (IssuerRenewalTime). StagedIssuersKept is how many issuing CAs
	// it replaced are still kept (unexpired).
	StagedIssuerDue   bool
	StagedIssuersKept int
	// LoadedRevision is the lowest revision a live replica loaded.
	LoadedRevision int
	// Agents are the registered clusters' agents.
	Agents []AgentRootObservation
}

// RootRotationConfig configures the decision.
type RootRotationConfig struct {
	// RenewAt is the fraction of the root's life after which a rotation
	// starts by itself; default 2/3, in [0.1, 0.9].
	RenewAt float64
	// Manual: no rotation starts by itself, whatever the root's age; only
	// an operator's request starts one (RenewAt is then not used).
	Manual bool
	// Grace is how long both roots stay accepted after the switch: at
	// least the agent certificate lifetime plus the time replicas take to
	// load a new state. Required.
	Grace time.Duration
}

// Default returns c with every zero field set to its default.
func (c RootRotationConfig) Default() RootRotationConfig {
	if c.RenewAt == 0 {
		c.RenewAt = DefaultIssuerRenewAt
	}
	return c
}

// Validate reports every problem with c, each with its field path.
func (c RootRotationConfig) Validate() error {
	var errs []error
	if c.RenewAt < 0.1 || c.RenewAt > 0.9 {
		errs = append(errs, fmt.Errorf("renewAt: %v is outside [0.1, 0.9]", c.RenewAt))
	}
	if c.Grace <= 0 {
		errs = append(errs, errors.New("grace: must be positive"))
	}
	return errors.Join(errs...)
}

// RootDecision is what NextRootRotation decided.
type RootDecision struct {
	State   RootRotationState
	Actions []RootAction
	// Waiting says what keeps the state where it is ("" when it moved or
	// there is nothing to do); Blocking lists the clusters it waits for,
	// each with its reason.
	Waiting  string
	Blocking []string
	// Refused says why an operator's request was refused.
	Refused string
	// Postponed says why a due renewal of the staged issuing CA waits.
	Postponed string
}

// Moved reports whether the decision changed the state.
func (d RootDecision) Moved(from RootRotationState) bool { return d.State != from }

// NextRootRotation decides one step of the relay root rotation from st,
// obs and now. It is pure: the caller writes State and performs Actions in
// one Update of the relay root Secret (with its resourceVersion), so a
// replica killed before the write changes nothing and the next Lease
// holder decides again from what was written.
func NextRootRotation(cfg RootRotationConfig, st RootRotationState, obs RootObservations, now time.Time) (RootDecision, error) {
	cfg = cfg.Default()
	if err := cfg.Validate(); err != nil {
		return RootDecision{}, fmt.Errorf("ca: invalid root rotation config: %w", err)
	}
	if err := st.Validate(); err != nil {
		return RootDecision{}, err
	}
	d := RootDecision{State: st}
	next := func(phase RootPhase) {
		d.State.Phase, d.State.Since, d.State.Revision, d.State.Grace = phase, now, st.Revision+1, cfg.Grace
	}
	swap := func(phase RootPhase) {
		next(phase)
		d.State.Old, d.State.New, d.State.RolledBack = st.New, st.Old, !st.RolledBack
	}
	clear := func() { d.Actions = append(d.Actions, RootActClearRequest) }
	rollback := obs.Request == RootRequestRollback

	if st.Phase == RootIdle {
		if rollback {
			clear()
			d.Refused = "no relay root rotation is in progress: nothing to roll back"
			return d, nil
		}
		due := !cfg.Manual && !obs.RootNotAfter.IsZero() && !now.Before(RenewalTime(obs.RootNotBefore, obs.RootNotAfter, cfg.RenewAt))
		start := obs.Request == RootRequestStart || due
		switch {
		case start && (obs.Staged == "" || obs.Staged == st.Old):
			d.Actions = append(d.Actions, RootActStage)
			d.Waiting = "staging a new relay root"
		case start:
			next(RootAddingNew)
			d.State.New, d.State.RolledBack = obs.Staged, false
			if obs.Request == RootRequestStart {
				clear()
			}
		case obs.Staged != "":
			// Left by a step that was not finished: used by nobody.
			d.Actions = append(d.Actions, RootActDiscard)
		}
		return d, nil
	}
	if obs.Request == RootRequestStart {
		clear()
		d.Refused = fmt.Sprintf("a relay root rotation is already in progress (phase %s)", st.Phase)
	}
	if rollback {
		clear()
		switch st.Phase {
		case RootAddingNew:
			// Nobody issued from New: it goes at once.
			next(RootIdle)
			d.State.New, d.State.RolledBack = "", true
			d.Actions = append(d.Actions, RootActDiscard)
		case RootSwitching:
			// Issue from Old again at once; New stays accepted for the
			// grace window, then leaves like an old root.
			swap(RootSwitching)
		case RootRemovingOld:
			// Old's keys are still there: deliver it again first.
			swap(RootAddingNew)
		}
		return d, nil
	}
	// The staged root's issuing CA ages while the rotation runs: it is
	// renewed like the current one, or a rotation held past its renewal
	// time would clamp every certificate to its end and, held longer,
	// issue from an expired CA. After a rollback the staged root only
	// leaves, but until then replicas load it, and an expired issuing CA
	// would stop them loading the rotation at all: renewed too.
	if obs.StagedIssuerDue {
		if obs.StagedIssuersKept >= maxPreviousIssuers {
			d.Postponed = fmt.Sprintf("the staged root's issuing CA is due for renewal, but %d issuing CAs it replaced are still accepted, at most %d; renew less often (a larger renew-at or issuing CA lifetime)",
				obs.StagedIssuersKept, maxPreviousIssuers)
		} else {
			d.Actions = append(d.Actions, RootActRenewStagedIssuer)
		}
	}
	if obs.LoadedRevision < st.Revision {
		d.Waiting = fmt.Sprintf("a live replica has loaded revision %d, not yet %d", obs.LoadedRevision, st.Revision)
		return d, nil
	}
	switch st.Phase {
	case RootAddingNew:
		if d.Blocking = unacknowledged(obs.Agents, st.Effective().Bundle); len(d.Blocking) > 0 {
			d.Waiting = fmt.Sprintf("%d connected agents have not acknowledged the bundle with the new root", len(d.Blocking))
			return d, nil
		}
		next(RootSwitching)
	case RootSwitching:
		if until := st.Since.Add(cfg.Grace); now.Before(until) {
			d.Waiting = "both roots stay accepted until " + until.UTC().Format(time.RFC3339)
			return d, nil
		}
		for _, a := range obs.Agents {
			if a.Connected && a.OnRoot == st.Old {
				d.Blocking = append(d.Blocking, a.Cluster+": still authenticates with a certificate under the old root")
			}
		}
		if len(d.Blocking) > 0 {
			d.Waiting = fmt.Sprintf("%d connected agents have not renewed under the new root", len(d.Blocking))
			return d, nil
		}
		next(RootRemovingOld)
	case RootRemovingOld:
		if d.Blocking = unacknowledged(obs.Agents, st.Effective().Bundle); len(d.Blocking) > 0 {
			d.Waiting = fmt.Sprintf("%d connected agents have not acknowledged the bundle without the old root", len(d.Blocking))
			return d, nil
		}
		next(RootIdle)
		d.State.Old, d.State.New = st.New, ""
		d.Actions = append(d.Actions, RootActDeleteOld)
	}
	return d, nil
}

// unacknowledged lists the connected agents that have not acknowledged
// bundle, each with its reason; an agent that cannot acknowledge is listed
// as such, never counted as done.
func unacknowledged(agents []AgentRootObservation, bundle []string) []string {
	want := BundleFingerprint(bundle)
	var out []string
	for _, a := range agents {
		switch {
		case !a.Connected || a.Acked == want:
		case !a.CanAcknowledge:
			out = append(out, a.Cluster+": its agent cannot acknowledge trust bundles (upgrade it)")
		default:
			out = append(out, a.Cluster+": has not acknowledged yet")
		}
	}
	slices.Sort(out)
	return out
}
