package fleet

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LifetimeConfig is issue 30's "years compressed into minutes": Replicas
// `relaymesh server` replicas with leader election, whose relay CA and
// agent certificates live minutes (their real flags: --agent-cert-ttl,
// --relay-issuer-ttl, --relay-issuer-renew-at,
// --relay-issuer-check-interval, --relay-root-grace), and Agents agents
// spread over them, each keeping its certificate with the real credential
// manager (AgentConfig.Credentials: renewal at identity.RenewalTime, relay
// trust bundles stored beside the old roots and acknowledged over the
// session). The run sees the issuing CA renewed, then starts a relay root
// rotation as `relaymesh ca relay rotate start` does (by running that
// command), kills the Lease holder with SIGKILL when the rotation reaches
// KillIn, and ends when the rotation is back at Idle under the new root,
// at least Renewals issuing-CA renewals happened and every agent pins the
// new root alone and holds a session.
type LifetimeConfig struct {
	Options
	// Agents is the fleet size; default 40. Replicas how many servers run;
	// default 3 (at least 2: one is killed).
	Agents, Replicas int
	// AgentCertTTL is --agent-cert-ttl; default 60s. It should be well
	// over a minute's share of the agent's renewal point: certificates are
	// backdated a minute, and the agent renews at 2/3 of the whole
	// validity (identity.RenewalTime).
	AgentCertTTL time.Duration
	// IssuerTTL is --relay-issuer-ttl (default 240s) and IssuerRenewAt
	// --relay-issuer-renew-at (default 0.35, a renewal every 84 s): the
	// server refuses settings whose rest of life after the renewal point
	// is shorter than AgentCertTTL + 2 × CheckInterval. The issuing CA
	// staged under the new root at the rotation's start is not renewed
	// before Idle, so IssuerTTL should leave it well over AgentCertTTL at
	// the end of the rotation (which takes the grace and more); else agent
	// certificates from it are clamped to its NotAfter, and each clamped
	// one is due for renewal at once.
	IssuerTTL     time.Duration
	IssuerRenewAt float64
	// CheckInterval is --relay-issuer-check-interval; default 2s.
	CheckInterval time.Duration
	// RootGrace is --relay-root-grace; 0 leaves the server's default
	// (AgentCertTTL + 2 × CheckInterval, also its minimum).
	RootGrace time.Duration
	// Renewals is how many issuing-CA renewals (a new issuing CA under the
	// same root) the run must see; default 2. RenewalsBeforeRotation of
	// them come before the rotation is started; default 1.
	Renewals, RenewalsBeforeRotation int
	// KillIn is the rotation phase in which the Lease holder is killed,
	// KillAfter after the phase began; default Switching, 5s.
	KillIn    ca.RootPhase
	KillAfter time.Duration
	// PerSecond paces the fleet's start; default 20 agents a second.
	PerSecond float64
	// Snapshot each agent pushes; default one mesh, one Service, one pod.
	Snapshot SnapshotSpec
	// Reopen is the longest an agent may be without a session between two
	// sessions before it counts as lost; default 60s (the session's
	// backoff is at most 30s, and a dead replica is left at once).
	Reopen time.Duration
	// Settle is how long the fleet runs on after the end condition holds,
	// before it is judged; default 5s.
	Settle time.Duration
	// Timeout bounds the run from the fleet's start; default 10 minutes.
	Timeout time.Duration
}

// LifetimeResult is what a lifetime run saw.
type LifetimeResult struct {
	Agents, Replicas int
	// ServerFlags are the lifetime flags every replica ran with.
	ServerFlags []string
	// Load is /proc/loadavg (1, 5, 15 min) when the run started and ended;
	// Wall the run from the first replica's start to the end.
	LoadStart, LoadEnd string
	Wall               time.Duration
	// Events are the relay CA's changes as the harness saw them in the
	// relay CA Secrets (read every 250 ms), the rotation's start, the kill
	// and the end, each at its time since the first replica started.
	Events []LifetimeEvent
	// IssuerRenewals counts new issuing CAs under the same root as the one
	// before (in relay-tls-signing-secret); Issuers lists every issuing CA
	// seen, in order.
	IssuerRenewals int
	Issuers        []IssuerSeen
	// RotateStart is what `relaymesh ca relay rotate start` printed.
	RotateStart string
	// OldRoot and NewRoot are the root fingerprints (ca.RootFingerprint)
	// before and after; RotationDone: the rotation reached Idle under
	// NewRoot. Phases are the phases seen, in order.
	OldRoot, NewRoot string
	RotationDone     bool
	Phases           []ca.RootPhase
	// Killed is the replica killed, KilledLeader whether it held the
	// Lease, KilledIn the phase and KilledAt when; KilledSessions how many
	// agents had their session on it.
	Killed         string
	KilledLeader   bool
	KilledIn       ca.RootPhase
	KilledAt       time.Duration
	KilledSessions int
	// Sessions per replica when the fleet was connected.
	Sessions map[string]int

	// Lost counts the agents lost, LostExamples says why for up to five.
	// An agent is lost when the server refused its session (its
	// certificate: PermissionDenied or Unauthenticated, after which it
	// stops), its credential manager asked for a bootstrap token (it held
	// no usable certificate: one refused or expired), it went longer than
	// Reopen without a session after its first, or it holds no session at
	// the end. A session that ends with its replica, or to verify the last
	// bundle of a rotation, and opens again within Reopen is not lost.
	Lost         int
	LostExamples []string
	// RefusedSessions counts agents whose session the server refused;
	// ReBootstraps the agents whose credential manager needed a new token
	// (AgentState.TokenAsks > 0); RefusedRenews the Renew calls the
	// replicas refused (their logs: "relay call refused" on Renew, or
	// issuance failed on renew); ThrottledRenews the renewals the agents'
	// credential managers saw refused for rate (ResourceExhausted: the
	// server's per-cluster renewal limit), which they retry.
	RefusedSessions, ReBootstraps, RefusedRenews, ThrottledRenews int
	// Renewals counts the agents' certificate renewals, fleet-wide;
	// MinRenewals is the fewest of one agent.
	Renewals, MinRenewals int
	// PinnedNewRoot counts agents pinning the new root alone at the end;
	// NotPinned describes up to five that do not.
	PinnedNewRoot int
	NotPinned     []string
	// Bundles pinned, refused and refused as predating the session
	// (followed by one reconnect), fleet-wide.
	BundlesPinned, BundlesRefused, BundlesStale int
	// SessionEnds counts ended sessions by cause: "killed replica" (on it,
	// after the kill), "bundle reconnect" (to verify a bundle), else the
	// gRPC code.
	SessionEnds map[string]int
	// MaxGap is the longest an agent went without a session between two,
	// and Gap the distribution of those gaps.
	MaxGap time.Duration
	Gap    Summary
	// CredentialLog counts the credential managers' WARN and ERROR lines
	// by message, fleet-wide.
	CredentialLog map[string]int
	// Regressions counts output sets older than one acked before.
	Regressions int
	// Replica is each replica's audit chain and log hygiene; Leaks tokens
	// or private keys found in any replica's logs.
	Replica []ReplicaReport
	Leaks   []string
}

// LifetimeEvent is one thing that happened, at its time since the first
// replica started.
type LifetimeEvent struct {
	At   time.Duration
	What string
}

// IssuerSeen is one issuing CA of relay-tls-signing-secret.
type IssuerSeen struct {
	Serial     string
	Generation int
	// Root is the fingerprint of the root it is under (matched by key
	// identifier against the roots of relay-root-tls-secret).
	Root     string
	NotAfter time.Time
	At       time.Duration
}

// caView is what the harness reads of the relay CA Secrets.
type caView struct {
	state      ca.RootRotationState
	current    *x509.Certificate // relay-root-tls-secret ca.crt
	staged     *x509.Certificate
	issuer     *x509.Certificate // relay-tls-signing-secret tls.crt
	generation int
}

func (m *Management) readCA(ctx context.Context) (caView, error) {
	var v caView
	root, err := m.Kube.CoreV1().Secrets(m.Namespace).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
	if err != nil {
		return v, err
	}
	if v.state, _, err = ca.DecodeRootRotation(root); err != nil {
		return v, err
	}
	if v.current, v.staged, err = ca.RootRotationRoots(root); err != nil {
		return v, err
	}
	signing, err := m.Kube.CoreV1().Secrets(m.Namespace).Get(ctx, ca.SigningSecretName, metav1.GetOptions{})
	if err != nil {
		return v, err
	}
	if v.generation, err = ca.IssuerGeneration(signing); err != nil {
		return v, err
	}
	block, _ := pem.Decode(signing.Data["tls.crt"])
	if block == nil {
		return v, fmt.Errorf("secret %s: tls.crt holds no certificate", ca.SigningSecretName)
	}
	v.issuer, err = x509.ParseCertificate(block.Bytes)
	return v, err
}

// issuerRoot is the fingerprint of whichever of v's roots signed v.issuer.
func (v caView) issuerRoot() string {
	for _, r := range []*x509.Certificate{v.current, v.staged} {
		if r != nil && bytes.Equal(r.SubjectKeyId, v.issuer.AuthorityKeyId) {
			return ca.RootFingerprint(r)
		}
	}
	return "unknown"
}

// gapLog records, per agent, when its sessions ended and opened: the
// longest time without one between two, and why sessions ended.
type gapLog struct {
	mu       sync.Mutex
	ended    map[string]time.Time
	gaps     []time.Duration
	maxGap   map[string]time.Duration
	ends     map[string]int
	killed   string // address of the killed replica
	killedAt time.Time
}

func (g *gapLog) opened(a *Agent, _ string, at time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e, ok := g.ended[a.Cluster()]; ok {
		d := at.Sub(e)
		g.gaps = append(g.gaps, d)
		g.maxGap[a.Cluster()] = max(g.maxGap[a.Cluster()], d)
		delete(g.ended, a.Cluster())
	}
}

func (g *gapLog) endedAt(a *Agent, server string, err error) {
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if errors.Is(err, context.Canceled) {
		return // the harness stopped the agent
	}
	if _, ok := g.ended[a.Cluster()]; !ok {
		g.ended[a.Cluster()] = now
	}
	switch {
	case server != "" && server == g.killed && !g.killedAt.IsZero():
		g.ends["killed replica"]++
	case err != nil && strings.Contains(err.Error(), "predates"):
		g.ends["bundle reconnect"]++
	default:
		g.ends[status.Code(err).String()]++
	}
}

func (g *gapLog) kill(addr string, at time.Time) {
	g.mu.Lock()
	g.killed, g.killedAt = addr, at
	g.mu.Unlock()
}

// open reports, for an agent without a session now, since when.
func (g *gapLog) openSince(cluster string) (time.Time, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	t, ok := g.ended[cluster]
	return t, ok
}

// Lifetime runs the lifetime scenario.
func Lifetime(ctx context.Context, cfg LifetimeConfig) (*LifetimeResult, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	cfg.defaults()
	if cfg.Agents < 1 || cfg.Replicas < 2 {
		return nil, errors.New("lifetime: at least 1 agent and 2 replicas (one is killed)")
	}
	if cfg.RenewalsBeforeRotation > cfg.Renewals {
		return nil, errors.New("lifetime: renewals before the rotation exceed the renewals")
	}
	m := cfg.Env.Mgmt
	r := &LifetimeResult{Agents: cfg.Agents, Replicas: cfg.Replicas, LoadStart: LoadAverage(), SessionEnds: map[string]int{}, CredentialLog: map[string]int{}}
	r.ServerFlags = []string{
		"--agent-cert-ttl", cfg.AgentCertTTL.String(),
		"--relay-issuer-ttl", cfg.IssuerTTL.String(),
		"--relay-issuer-renew-at", strconv.FormatFloat(cfg.IssuerRenewAt, 'f', -1, 64),
		"--relay-issuer-check-interval", cfg.CheckInterval.String(),
		// Started by the command, at a point of the run's choosing.
		"--relay-root-renew-at", "0",
	}
	if cfg.RootGrace != 0 {
		r.ServerFlags = append(r.ServerFlags, "--relay-root-grace", cfg.RootGrace.String())
	}
	cfg.ServerArgs = append(slices.Clone(cfg.ServerArgs), r.ServerFlags...)
	t0 := time.Now()
	event := func(format string, a ...any) {
		e := LifetimeEvent{At: time.Since(t0).Round(time.Millisecond), What: fmt.Sprintf(format, a...)}
		r.Events = append(r.Events, e)
		cfg.Logf("lifetime: %s: %s", e.At, e.What)
	}
	reps, err := cfg.startReplicas(ctx, "lifetime", cfg.Replicas)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, rep := range reps {
			_ = rep.Stop()
		}
	}()
	byAddr := map[string]*Replica{}
	var addrs []string
	for _, rep := range reps {
		byAddr[rep.Addr] = rep
		addrs = append(addrs, rep.Addr)
	}
	wctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	leader, err := waitLeader(wctx, m, reps, "")
	if err != nil {
		return nil, err
	}
	v, err := m.readCA(ctx)
	if err != nil {
		return nil, err
	}
	r.OldRoot = ca.RootFingerprint(v.current)
	r.Issuers = append(r.Issuers, IssuerSeen{Serial: v.issuer.SerialNumber.Text(16), Generation: v.generation, Root: v.issuerRoot(), NotAfter: v.issuer.NotAfter, At: time.Since(t0)})
	event("%d replicas up, %s holds the Lease; root %.12s, issuing CA generation %d valid until %s", len(reps), leader, r.OldRoot, v.generation, v.issuer.NotAfter.Format(time.TimeOnly))

	members, _, _, err := cfg.registerFleet(ctx, "lt", cfg.Agents)
	if err != nil {
		return nil, err
	}
	rootsPEM, err := ca.RelayRootsPEM(ctx, m.Kube, m.Namespace)
	if err != nil {
		return nil, err
	}
	roots, err := m.RelayRoots(ctx)
	if err != nil {
		return nil, err
	}
	gl := &gapLog{ended: map[string]time.Time{}, maxGap: map[string]time.Duration{}, ends: map[string]int{}}
	orders := serverOrders(addrs)
	f := &Fleet{byCluster: map[string]*Agent{}}
	for i, mem := range members {
		a, err := NewAgent(AgentConfig{Cluster: mem.Cluster, Token: mem.Token, Source: SourceAddr(i),
			Servers: orders[i%len(orders)], Roots: roots, Snapshot: cfg.Snapshot.Snapshot(mem.Cluster),
			Credentials: &CredentialsConfig{RootsPEM: rootsPEM},
			Hooks:       Hooks{SessionOpened: gl.opened, SessionEnded: gl.endedAt}})
		if err != nil {
			return nil, fmt.Errorf("agent %d: %w", i, err)
		}
		f.agents = append(f.agents, a)
		f.byCluster[mem.Cluster] = a
	}
	defer f.Stop()
	f.StartPaced(ctx, cfg.PerSecond)
	if err := f.Wait(wctx, "connected", Connected); err != nil {
		return nil, err
	}
	r.Sessions = sessionsOf(f, byAddr)
	event("%d agents connected; sessions %v", cfg.Agents, r.Sessions)

	// Watch the relay CA until the end condition holds.
	var (
		requested  bool
		killed     *Replica
		phaseSince time.Time
		lastPhase  = v.state.Phase
		lastIssuer = v.issuer.SerialNumber.Text(16)
		doneAt     time.Time
	)
	r.Phases = append(r.Phases, lastPhase)
	for {
		select {
		case <-wctx.Done():
			return r, fmt.Errorf("lifetime: not done after %s (renewals %d of %d, phases %v, rotation done %v): %w; %w",
				cfg.Timeout, r.IssuerRenewals, cfg.Renewals, r.Phases, r.RotationDone, wctx.Err(), lifetimeExample(f, gl))
		case <-time.After(250 * time.Millisecond):
		}
		v, err := m.readCA(ctx)
		if err != nil {
			return r, err
		}
		now := time.Now()
		if serial := v.issuer.SerialNumber.Text(16); serial != lastIssuer {
			prev := r.Issuers[len(r.Issuers)-1]
			seen := IssuerSeen{Serial: serial, Generation: v.generation, Root: v.issuerRoot(), NotAfter: v.issuer.NotAfter, At: time.Since(t0)}
			r.Issuers = append(r.Issuers, seen)
			lastIssuer = serial
			if seen.Root == prev.Root {
				r.IssuerRenewals++
				event("issuing CA renewed (%d): generation %d, valid until %s, under root %.12s", r.IssuerRenewals, v.generation, v.issuer.NotAfter.Format(time.TimeOnly), seen.Root)
			} else {
				event("issuing CA replaced by one under root %.12s (generation %d, valid until %s)", seen.Root, v.generation, v.issuer.NotAfter.Format(time.TimeOnly))
			}
		}
		if v.state.Phase != lastPhase {
			lastPhase, phaseSince = v.state.Phase, now
			r.Phases = append(r.Phases, lastPhase)
			event("root rotation: %s (revision %d)", lastPhase, v.state.Revision)
			if lastPhase == ca.RootIdle && ca.RootFingerprint(v.current) != r.OldRoot {
				r.RotationDone, r.NewRoot = true, ca.RootFingerprint(v.current)
			}
		}
		if !requested && r.IssuerRenewals >= cfg.RenewalsBeforeRotation {
			out, err := cfg.rotateStart(ctx)
			r.RotateStart = out
			if err != nil {
				return r, err
			}
			requested = true
			event("relaymesh ca relay rotate start: %s", firstLine(out))
		}
		if requested && killed == nil && lastPhase == cfg.KillIn && now.Sub(phaseSince) >= cfg.KillAfter {
			holder, err := m.LeaseHolder(ctx)
			if err != nil {
				return r, err
			}
			for _, rep := range reps {
				if rep.Name == holder {
					killed = rep
				}
			}
			if killed == nil {
				return r, fmt.Errorf("the Lease names %q, not a replica", holder)
			}
			for _, a := range f.agents {
				if st := a.State(); st.Connected && st.Server == killed.Addr {
					r.KilledSessions++
				}
			}
			at := time.Now()
			gl.kill(killed.Addr, at)
			if err := killed.Kill(); err != nil {
				return r, fmt.Errorf("kill %s: %w", killed.Name, err)
			}
			r.Killed, r.KilledLeader, r.KilledIn, r.KilledAt = killed.Name, true, lastPhase, at.Sub(t0)
			event("SIGKILL %s (the Lease holder) in %s, %d agents on it", killed.Name, lastPhase, r.KilledSessions)
		}
		if killed == nil && requested && pastPhase(r.Phases, cfg.KillIn) {
			return r, fmt.Errorf("lifetime: the rotation went past %s before the kill (phases %v)", cfg.KillIn, r.Phases)
		}
		// Done: the rotation at Idle under the new root after the kill, the
		// renewals seen, one of them of an issuing CA under the new root,
		// and every agent connected. Whether each pins the new root alone
		// is judged after Settle: Idle offers agents no bundle, so waiting
		// longer changes nothing.
		done := r.RotationDone && killed != nil && r.IssuerRenewals >= cfg.Renewals && renewedUnder(r.Issuers, r.NewRoot)
		if done {
			for _, a := range f.agents {
				if st := a.State(); !st.Connected {
					done = false
					break
				}
			}
		}
		if done && doneAt.IsZero() {
			doneAt = now
			event("rotation at Idle under the new root, %d issuing-CA renewals, every agent connected; settling %s", r.IssuerRenewals, cfg.Settle)
		}
		if !doneAt.IsZero() && now.Sub(doneAt) >= cfg.Settle {
			break
		}
	}

	// Judge every agent.
	end, err := m.readCA(ctx)
	if err != nil {
		return r, err
	}
	want := ca.TrustBundleFingerprint([]*x509.Certificate{end.current})
	r.MinRenewals = -1
	for _, a := range f.agents {
		st := a.State()
		if st.Refused != nil {
			r.RefusedSessions++
		}
		if st.TokenAsks > 0 {
			r.ReBootstraps++
		}
		gl.mu.Lock()
		gap := gl.maxGap[st.Cluster]
		if since, ok := gl.ended[st.Cluster]; ok && !st.Connected {
			gap = max(gap, time.Since(since))
		}
		gl.mu.Unlock()
		if why := lostReasons(st, gap, cfg.Reopen); len(why) > 0 {
			r.Lost++
			if len(r.LostExamples) < 5 {
				r.LostExamples = append(r.LostExamples, st.Cluster+": "+strings.Join(why, "; "))
			}
		}
		if st.Pinned == want {
			r.PinnedNewRoot++
		} else if len(r.NotPinned) < 5 {
			r.NotPinned = append(r.NotPinned, fmt.Sprintf("%s pins %.12s, not %.12s (the new root alone): bundles pinned %d, refused as predating the session %d, refused %d; %d sessions",
				st.Cluster, st.Pinned, want, st.BundlesPinned, st.BundlesStale, st.BundlesRefused, st.Sessions))
		}
		r.Renewals += st.Renewals
		if r.MinRenewals < 0 || st.Renewals < r.MinRenewals {
			r.MinRenewals = st.Renewals
		}
		r.BundlesPinned += st.BundlesPinned
		r.BundlesRefused += st.BundlesRefused
		r.BundlesStale += st.BundlesStale
		r.Regressions += st.Regressions
		for k, n := range st.CredentialLog {
			r.CredentialLog[k] += n
			if strings.Contains(k, "code = "+codes.ResourceExhausted.String()) {
				r.ThrottledRenews += n
			}
		}
	}
	gl.mu.Lock()
	r.Gap = Summarize(gl.gaps)
	for _, d := range gl.maxGap {
		r.MaxGap = max(r.MaxGap, d)
	}
	for k, n := range gl.ends {
		r.SessionEnds[k] = n
	}
	gl.mu.Unlock()
	f.Stop()
	killedNames := map[string]bool{r.Killed: true}
	if r.Replica, r.Leaks, r.RefusedRenews, err = replicaHygiene(reps, killedNames, members); err != nil {
		return r, err
	}
	r.Wall = time.Since(t0)
	r.LoadEnd = LoadAverage()
	event("done: %d lost, %d refused Renews (%d throttled), %d re-bootstraps, %d of %d agents pin the new root alone %v, %d agent renewals (fewest %d)",
		r.Lost, r.RefusedRenews, r.ThrottledRenews, r.ReBootstraps, r.PinnedNewRoot, r.Agents, r.NotPinned, r.Renewals, r.MinRenewals)
	return r, nil
}

// lostReasons says why an agent is lost (none: it is not), from its state
// at the end and the longest it went without a session between two (or
// since its last one ended): its session refused, its credential manager
// asking for a token, no session now, or a gap longer than reopen.
func lostReasons(st AgentState, gap, reopen time.Duration) []string {
	var why []string
	if st.Refused != nil {
		why = append(why, fmt.Sprintf("session refused (%s)", status.Code(st.Refused)))
	}
	if st.TokenAsks > 0 {
		why = append(why, fmt.Sprintf("asked for a bootstrap token %d times (%s)", st.TokenAsks, st.LastCredentialError))
	}
	if !st.Connected {
		why = append(why, fmt.Sprintf("no session at the end (last error %v)", st.LastError))
	}
	if gap > reopen {
		why = append(why, fmt.Sprintf("%s without a session", gap.Round(time.Millisecond)))
	}
	return why
}

func (cfg *LifetimeConfig) defaults() {
	if cfg.Agents == 0 {
		cfg.Agents = 40
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 3
	}
	if cfg.AgentCertTTL == 0 {
		cfg.AgentCertTTL = 60 * time.Second
	}
	if cfg.IssuerTTL == 0 {
		cfg.IssuerTTL = 240 * time.Second
	}
	if cfg.IssuerRenewAt == 0 {
		cfg.IssuerRenewAt = 0.35
	}
	if cfg.CheckInterval == 0 {
		cfg.CheckInterval = 2 * time.Second
	}
	if cfg.Renewals == 0 {
		cfg.Renewals = 2
	}
	if cfg.RenewalsBeforeRotation == 0 {
		cfg.RenewalsBeforeRotation = 1
	}
	if cfg.KillIn == "" {
		cfg.KillIn = ca.RootSwitching
	}
	if cfg.KillAfter == 0 {
		cfg.KillAfter = 5 * time.Second
	}
	if cfg.PerSecond == 0 {
		cfg.PerSecond = 20
	}
	if cfg.Reopen == 0 {
		cfg.Reopen = 60 * time.Second
	}
	if cfg.Settle == 0 {
		cfg.Settle = 5 * time.Second
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Minute
	}
}

// rotateStart runs `relaymesh ca relay rotate start` of the binary under
// test against the management cluster, as an operator would.
func (cfg *LifetimeConfig) rotateStart(ctx context.Context) (string, error) {
	cmd := exec.CommandContext(ctx, cfg.Env.Binary, "ca", "relay", "rotate", "start",
		"--kubeconfig", cfg.Env.Cluster.Kubeconfig, "--namespace", cfg.Env.Mgmt.Namespace)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("relaymesh ca relay rotate start: %w: %s", err, truncate(string(out), 500))
	}
	return string(out), nil
}

// renewedUnder reports whether issuers holds a renewal under root: two
// issuing CAs in a row under it.
func renewedUnder(issuers []IssuerSeen, root string) bool {
	for i := 1; i < len(issuers); i++ {
		if issuers[i].Root == root && issuers[i-1].Root == root {
			return true
		}
	}
	return false
}

// pastPhase reports whether phases went from phase to another one.
func pastPhase(phases []ca.RootPhase, phase ca.RootPhase) bool {
	i := slices.Index(phases, phase)
	return i >= 0 && i < len(phases)-1
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}

// lifetimeExample describes agents that are not where the run wants them.
func lifetimeExample(f *Fleet, gl *gapLog) error {
	var notConnected, refused, asked int
	var ex string
	for _, a := range f.agents {
		st := a.State()
		bad := false
		if !st.Connected {
			notConnected++
			bad = true
		}
		if st.Refused != nil {
			refused++
			bad = true
		}
		if st.TokenAsks > 0 {
			asked++
			bad = true
		}
		if bad && ex == "" {
			since, _ := gl.openSince(st.Cluster)
			ex = fmt.Sprintf("%s: connected %v (without since %s), refused %v, token asks %d, pinned %.12s, last error %v, credential error %s",
				st.Cluster, st.Connected, since.Format(time.TimeOnly), st.Refused, st.TokenAsks, st.Pinned, st.LastError, st.LastCredentialError)
		}
	}
	return fmt.Errorf("%d agents without a session, %d refused, %d asked for a token (e.g. %s)", notConnected, refused, asked, ex)
}

// replicaHygiene reads every replica's audit chain and WARN/ERROR log
// lines, the tokens or keys in its logs, and the Renew calls it refused.
func replicaHygiene(reps []*Replica, killed map[string]bool, members []Member) ([]ReplicaReport, []string, int, error) {
	var out []ReplicaReport
	var leaks []string
	refusedRenews := 0
	for _, rep := range reps {
		rr := ReplicaReport{Name: rep.Name, Killed: killed[rep.Name]}
		if n, err := rep.VerifyAudit(); err != nil {
			rr.AuditError = err.Error()
		} else {
			rr.AuditRecords = n
		}
		lines, err := ReadLog(rep.LogPath(), time.Time{}, func(l LogLine) bool { return l.Level == "WARN" || l.Level == "ERROR" })
		if err != nil {
			return nil, nil, 0, err
		}
		for _, l := range lines {
			switch {
			case l.Msg == "relay call refused" && strings.HasSuffix(fmt.Sprint(l.Attrs["method"]), "/Renew"):
				refusedRenews++
			case l.Msg == "agent certificate issuance failed" && fmt.Sprint(l.Attrs["operation"]) == "renew":
				refusedRenews++
			}
		}
		rr.Logs = LogCounts(lines)
		out = append(out, rr)
		found, err := rep.FindSecrets(members)
		if err != nil {
			return nil, nil, 0, err
		}
		leaks = append(leaks, found...)
	}
	return out, leaks, refusedRenews, nil
}
