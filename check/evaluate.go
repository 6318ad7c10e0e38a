package check

import (
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/relaymesh/relaymesh/server/leader"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/trust"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/duration"
)

// Clock-offset thresholds between an agent and the server. Certificates
// are backdated by a minute (ca.Config.Backdate), so beyond that a freshly
// issued certificate is not yet valid on the side whose clock is behind.
const (
	ClockWarn  = 5 * time.Second
	ClockError = time.Minute
)

// Metric names the evaluation reads from the server.
const (
	metricConnectedAgents = "relaymesh_relay_connected_agents"
	metricWebhookInfo     = "relaymesh_admission_webhook_info"
	metricIssuerDue       = "relaymesh_relay_issuer_renewal_due"
	metricIssuerGen       = "relaymesh_relay_issuer_generation"
)

// agentRenewAt is when agents renew their certificates (identity.RenewalTime).
const agentRenewAt = 2.0 / 3

// defaultIntermediateRenewAt is the intermediates' renewal point unless a
// VirtualMesh sets intermediateOptions.renewAtPercent.
const defaultIntermediateRenewAt = 0.66

// Evaluate turns observations into results at now. It is pure.
func Evaluate(o *Observations, now time.Time) []Result {
	var rs []Result
	rs = append(rs, evalCRDs(o)...)
	rs = append(rs, evalRelayCA(o, now)...)
	rs = append(rs, evalServer(o, now)...)
	rs = append(rs, evalReplicas(o, now)...)
	rs = append(rs, evalAgents(o, now)...)
	rs = append(rs, evalVirtualMeshes(o, now)...)
	rs = append(rs, evalTrustDomains(o)...)
	rs = append(rs, evalFederation(o, now)...)
	rs = append(rs, evalMulticluster(o)...)
	rs = append(rs, evalIstiod(o)...)
	rs = append(rs, evalWebhook(o)...)
	rs = append(rs, evalDashboard(o)...)
	rs = append(rs, evalAmbient(o)...)
	return rs
}

func result(area, subject string, s Severity, format string, args ...any) Result {
	return Result{Area: area, Subject: subject, Severity: s, Message: fmt.Sprintf(format, args...)}
}

func evalCRDs(o *Observations) []Result {
	var rs []Result
	for _, c := range o.CRDs {
		switch {
		case c.Err != nil:
			rs = append(rs, result(AreaCRDs, c.Name, Error, "cannot read the CRD: %v", c.Err))
		case !c.Found:
			rs = append(rs, result(AreaCRDs, c.Name, Error, "not installed: apply Relaymesh's CRDs (charts/relaymesh-server/crds or api/crds)"))
		case !c.Served || !c.Stored:
			rs = append(rs, result(AreaCRDs, c.Name, Error, "version %s is not served and stored: install the CRDs of this relaymesh version", c.Version))
		case !c.Established:
			rs = append(rs, result(AreaCRDs, c.Name, Error, "not established: the apiserver does not serve it (see its status conditions)"))
		case c.SchemaDiffers:
			rs = append(rs, result(AreaCRDs, c.Name, Warning, "installed, but its %s schema is not this relaymesh version's: fields the server writes may be dropped; apply the CRDs of this version", c.Version))
		default:
			rs = append(rs, result(AreaCRDs, c.Name, OK, "installed, %s served and stored", c.Version))
		}
	}
	return rs
}

func evalRelayCA(o *Observations, now time.Time) []Result {
	subject := o.Namespace + "/relay-root-tls-secret"
	if o.RelayRootsErr != nil {
		return []Result{result(AreaRelayCA, subject, Error, "cannot read the relay roots: %v (has the server started once?)", o.RelayRootsErr)}
	}
	var rs []Result
	for _, r := range o.RelayRoots {
		sev, msg := Expiry(Lifetime{What: "relay root " + r.Subject.CommonName, NotBefore: r.NotBefore, NotAfter: r.NotAfter}, now)
		rs = append(rs, result(AreaRelayCA, subject, sev, "%s", msg))
	}
	signing := o.Namespace + "/relay-tls-signing-secret"
	switch {
	case o.SigningCAErr != nil:
		rs = append(rs, result(AreaRelayCA, signing, Error, "cannot read the relay issuing CA: %v", o.SigningCAErr))
	case o.SigningCA != nil:
		c := o.SigningCA
		sev, msg := Expiry(Lifetime{What: "relay issuing CA " + c.Subject.CommonName, NotBefore: c.NotBefore, NotAfter: c.NotAfter}, now)
		rs = append(rs, result(AreaRelayCA, signing, sev, "%s", msg))
		if len(o.RelayRoots) > 0 {
			if _, err := c.Verify(x509.VerifyOptions{Roots: pool(o.RelayRoots), CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
				rs = append(rs, result(AreaRelayCA, signing, Error, "the issuing CA does not chain to the relay roots: %v", err))
			}
		}
	}
	rs = append(rs, evalIssuerRenewal(o)...)
	return append(rs, evalRelayRotation(o, now)...)
}

// maxListedAgents bounds the agents a relay root rotation result names;
// relaymesh ca relay rotate status lists them all.
const maxListedAgents = 10

// evalRelayRotation says where the relay root rotation is: Idle, the
// relay CA's roots and issuing CA generation; in progress, the phase, how
// long it has run and the agents it has not heard from (those that refused
// the bundle each an error); stuck, what to run.
func evalRelayRotation(o *Observations, now time.Time) []Result {
	subject := o.Namespace + "/relay-root-tls-secret"
	statusCmd := "relaymesh ca relay rotate status -n " + o.Namespace
	if o.RelayRotationErr != nil {
		return []Result{result(AreaRelayCA, subject, Error, "cannot read the relay root rotation: %v (see %s)", o.RelayRotationErr, statusCmd)}
	}
	r := o.RelayRotation
	if r == nil {
		return nil
	}
	var rs []Result
	gen := "issuing CA generation unknown"
	switch {
	case o.IssuerGenerationErr != nil:
		rs = append(rs, result(AreaRelayCA, o.Namespace+"/relay-tls-signing-secret", Error, "%v", o.IssuerGenerationErr))
	case o.IssuerGeneration > 0:
		gen = fmt.Sprintf("issuing CA generation %d", o.IssuerGeneration)
	}
	var agents []ca.RootAgentRecord
	if o.ClustersErr == nil {
		agents = ca.RootAgentRecords(o.Clusters)
	}
	st := ca.RootRotationStatusOf(r.State, r.Request, r.Current, r.Staged, agents)
	root := func(c *ca.RootStatusCert) string {
		if c == nil {
			return "(not in the Secret)"
		}
		return fmt.Sprintf("%s (%s, expires %s)", trust.ShortFingerprint(c.Fingerprint), c.Subject, c.NotAfter.Format(time.DateOnly))
	}
	pending := ""
	if r.Request != ca.RootRequestNone {
		pending = fmt.Sprintf("; a %s request is pending: %s", r.Request, st.Next)
	}
	if st.Phase == ca.RootIdle {
		return append(rs, result(AreaRelayCA, subject, OK, "relay CA: root %s, %s; no root rotation in progress (%d transitions so far)%s",
			root(st.OldRoot), gen, st.Revision, pending))
	}
	if r.Staged != nil && (st.Phase == ca.RootAddingNew || st.Phase == ca.RootSwitching) {
		// The root every agent pins next: its expiry, as evalRelayCA says
		// of the current one.
		sev, msg := Expiry(Lifetime{What: "staged relay root " + r.Staged.Subject.CommonName, NotBefore: r.Staged.NotBefore, NotAfter: r.Staged.NotAfter}, now)
		rs = append(rs, result(AreaRelayCA, subject, sev, "%s", msg))
	}
	ran := "for an unknown time"
	if st.Since != nil {
		ran = "for " + duration.HumanDuration(now.Sub(*st.Since))
	}
	rolled := ""
	if st.RolledBack {
		rolled = ", rolled back: the new root is the one it had"
	}
	var names []string
	connected := 0
	for _, a := range st.Agents {
		if a.Connected {
			connected++
			if a.Refused != "" {
				rs = append(rs, result(AreaRelayCA, a.Cluster, Error, "the agent refused the relay trust bundle of the root rotation (phase %s): %q; the rotation waits for it: fix what the agent's log says (an agent that does not handle trust bundles needs an upgrade), or %s",
					st.Phase, text.Truncate(a.Refused, 512), "relaymesh ca relay rotate rollback -n "+o.Namespace))
			}
		}
		if len(names) < maxListedAgents {
			state := "offline"
			switch {
			case a.Connected && a.Refused != "":
				state = "refused"
			case a.Connected:
				state = "connected"
			}
			names = append(names, a.Cluster+" ("+state+")")
		}
	}
	who := "every relay-mode agent acknowledged the bundle of this phase"
	if o.ClustersErr != nil {
		who = "the agents are unknown (the KubernetesClusters cannot be listed)"
	} else if len(st.Agents) > 0 {
		more := ""
		if n := len(st.Agents) - len(names); n > 0 {
			more = fmt.Sprintf(" and %d more (%s lists them)", n, statusCmd)
		}
		who = fmt.Sprintf("%d agent(s) have not acknowledged the bundle of this phase, %d of them connected: %s%s", len(st.Agents), connected, strings.Join(names, ", "), more)
	}
	msg := fmt.Sprintf("relay root rotation in phase %s %s (revision %d%s): root %s → %s; %s; %s",
		st.Phase, ran, st.Revision, rolled, root(st.OldRoot), root(st.NewRoot), gen, who)
	grace, assumed := r.Grace, ""
	switch {
	case r.State.Grace > 0:
		// The grace of the server that decided the phase, recorded with it.
		grace = r.State.Grace
	case grace == DefaultRelayRootGrace:
		assumed = " (from the grace of a server with the default --agent-cert-ttl and --relay-issuer-check-interval)"
	}
	if st.Since != nil && grace > 0 {
		limit := grace
		if st.Phase == ca.RootSwitching {
			// Switching lasts the grace by design.
			limit = 2 * grace
		}
		if now.Sub(*st.Since) > limit {
			return append(rs, result(AreaRelayCA, subject, Error, "stuck for longer than %s%s: %s; see what it waits for with %s, or roll it back with relaymesh ca relay rotate rollback -n %s",
				duration.HumanDuration(limit), assumed, msg, statusCmd, o.Namespace))
		}
	}
	return append(rs, result(AreaRelayCA, subject, Warning, "%s; next: %s", msg, st.Next))
}

// evalIssuerRenewal reads the server's issuing CA metrics: past its
// renewal point and not renewed is a warning (a provided CA, which the
// server cannot renew, or a generated one whose renewal fails).
func evalIssuerRenewal(o *Observations) []Result {
	if o.Metrics == nil {
		return nil
	}
	due, ok := o.Metrics.Value(metricIssuerDue, nil)
	if !ok {
		return nil
	}
	gen, _ := o.Metrics.Value(metricIssuerGen, nil)
	subject := o.Namespace + "/relay-tls-signing-secret"
	if due == 1 {
		return []Result{result(AreaRelayCA, subject, Warning,
			"the relay issuing CA (generation %.0f) is past its renewal point and not renewed: a provided CA (--ca-cert, --ca-secret) must be replaced before it expires; a generated one is renewed by the Lease holder within --relay-issuer-check-interval, so if this stays, read the server's log (%s)", gen, o.MetricsFrom)}
	}
	return []Result{result(AreaRelayCA, subject, OK, "the relay issuing CA (generation %.0f) is not due for renewal (%s)", gen, o.MetricsFrom)}
}

func evalServer(o *Observations, now time.Time) []Result {
	s := o.Server
	switch {
	case s.Address == "":
		return []Result{result(AreaServer, "relay", Warning, "the relay address is unknown (no --server-address, and no workload cluster's relaymesh-agent-config to read it from): not dialled")}
	case s.DialErr != nil:
		return []Result{result(AreaServer, s.Address, Error, "unreachable (address from %s): %v", s.AddressFrom, s.DialErr)}
	case s.VerifyErr != nil:
		return []Result{result(AreaServer, s.Address, Error, "serves a certificate that does not verify against the relay root: %v", s.VerifyErr)}
	case len(s.Chain) == 0:
		return []Result{result(AreaServer, s.Address, Error, "presented no certificate")}
	}
	leaf := s.Chain[0]
	sev, msg := Expiry(Lifetime{What: "the serving certificate", NotBefore: leaf.NotBefore, NotAfter: leaf.NotAfter, RenewAt: agentRenewAt}, now)
	rs := []Result{result(AreaServer, s.Address, OK, "reachable (address from %s), serving a certificate that chains to the relay root", s.AddressFrom)}
	return append(rs, result(AreaServer, s.Address, sev, "%s", msg))
}

// evalReplicas reports the server's replicas: which one leads (runs the
// once-only work: output versions, statuses, rotations) and which have
// stopped renewing their own Lease.
func evalReplicas(o *Observations, now time.Time) []Result {
	const subject = "replicas"
	var rs []Result
	switch {
	case apierrors.IsNotFound(o.ServerLeaseErr):
		rs = append(rs, result(AreaServer, subject, Warning, "no Lease %s/%s: the server runs with --leader-elect=false (keep exactly one replica) or has never started", o.Namespace, leader.ServerLease))
	case o.ServerLeaseErr != nil:
		rs = append(rs, result(AreaServer, subject, Warning, "cannot read the Lease %s/%s: %v", o.Namespace, leader.ServerLease, o.ServerLeaseErr))
	case o.ServerLease != nil:
		holder, age, dur, ok := leaseState(o.ServerLease.Spec, now)
		switch {
		case holder == "":
			rs = append(rs, result(AreaServer, subject, Error, "no replica holds the Lease %s: new output versions, statuses and rotations wait for a leader (is any replica running?)", leader.ServerLease))
		case !ok:
			rs = append(rs, result(AreaServer, subject, Error, "replica %s last renewed the Lease %s %s ago (it lasts %s): new output versions, statuses and rotations wait for a leader", holder, leader.ServerLease, duration.HumanDuration(age), dur))
		default:
			rs = append(rs, result(AreaServer, subject, OK, "replica %s leads (Lease %s renewed %s ago)", holder, leader.ServerLease, duration.HumanDuration(max(age, 0))))
		}
	}
	if o.ReplicaLeasesErr != nil {
		return append(rs, result(AreaServer, subject, Warning, "cannot list the replicas' Leases: %v", o.ReplicaLeasesErr))
	}
	var alive, storeUsers, storeLost []string
	for _, l := range o.ReplicaLeases {
		holder, age, dur, ok := leaseState(l.Spec, now)
		if ok {
			alive = append(alive, holder)
			switch l.Annotations[leader.StoreAnnotation] {
			case leader.StoreReachable:
				storeUsers = append(storeUsers, holder)
			case leader.StoreUnreachable:
				storeUsers = append(storeUsers, holder)
				storeLost = append(storeLost, holder)
			}
			continue
		}
		rs = append(rs, result(AreaServer, "replica "+l.Name, Warning, "not renewed for %s (it lasts %s): the replica crashed or is cut off from the apiserver, and its agents reconnect to the others; the leader deletes this Lease %s after it expired",
			duration.HumanDuration(age), dur, duration.HumanDuration(leader.GoneAfter)))
	}
	if len(alive) > 0 {
		slices.Sort(alive)
		rs = append(rs, result(AreaServer, subject, OK, "%d replica(s) renewing their Leases: %s", len(alive), strings.Join(alive, ", ")))
	}
	return append(rs, evalSnapshotStore(storeUsers, storeLost)...)
}

// evalSnapshotStore reports whether the replicas that keep snapshots in
// Redis (--snapshot-store=redis) reach it, as their Leases say.
func evalSnapshotStore(users, lost []string) []Result {
	const subject = "snapshot store"
	slices.Sort(lost)
	switch {
	case len(users) == 0:
		return nil
	case len(lost) == len(users):
		return []Result{result(AreaServer, subject, Error, "no replica reaches the snapshot store (Redis): snapshots pushed since are not shared, and every replica serves what it read last; check Redis and the replicas' --redis-* flags")}
	case len(lost) > 0:
		return []Result{result(AreaServer, subject, Warning, "replica(s) %s cannot reach the snapshot store (Redis) while others can: they end their sessions and give up the Lease until they reach it again (a network partition?)", strings.Join(lost, ", "))}
	}
	return []Result{result(AreaServer, subject, OK, "%d replica(s) reach the snapshot store (Redis)", len(users))}
}

// leaseState reads a Lease: its holder, how long ago it was renewed, how
// long it lasts, and whether it is current at now.
func leaseState(l coordinationv1.LeaseSpec, now time.Time) (holder string, age, dur time.Duration, current bool) {
	if l.HolderIdentity != nil {
		holder = *l.HolderIdentity
	}
	dur = 15 * time.Second
	if l.LeaseDurationSeconds != nil {
		dur = time.Duration(*l.LeaseDurationSeconds) * time.Second
	}
	if l.RenewTime == nil {
		return holder, 0, dur, false
	}
	age = now.Sub(l.RenewTime.Time)
	return holder, age, dur, holder != "" && age <= dur
}

func evalAgents(o *Observations, now time.Time) []Result {
	if o.ClustersErr != nil {
		return []Result{result(AreaAgents, o.Namespace, Error, "cannot list the KubernetesClusters: %v", o.ClustersErr)}
	}
	var rs []Result
	registered := map[string]*multiclusterv1alpha1.KubernetesCluster{}
	connected := 0
	for i := range o.Clusters {
		kc := &o.Clusters[i]
		registered[kc.Name] = kc
		if kc.Spec.Mode == multiclusterv1alpha1.ModeKubeconfig {
			rs = append(rs, result(AreaAgents, kc.Name, Warning, "registered in kubeconfig mode (WEAKER): the server holds this cluster's credentials and runs its agent itself"))
			continue
		}
		if kc.Status.Connected {
			connected++
			version := kc.Status.AgentVersion
			if version == "" {
				version = "unknown"
			}
			rs = append(rs, result(AreaAgents, kc.Name, OK, "agent connected (version %s)", version))
		} else {
			seen := "never"
			if kc.Status.LastSeen != nil {
				seen = duration.HumanDuration(now.Sub(kc.Status.LastSeen.Time)) + " ago"
			}
			rs = append(rs, result(AreaAgents, kc.Name, Error, "agent not connected (last seen %s)", seen))
		}
		rs = append(rs, evalClock(kc)...)
		if c := kc.Status.AgentCertificate; c != nil && workloadOf(o, kc.Name) == nil {
			// Without the workload cluster only the expiry is known.
			if !c.NotAfter.After(now) {
				rs = append(rs, result(AreaAgents, kc.Name, Error, "the agent's last certificate expired %s ago", duration.HumanDuration(now.Sub(c.NotAfter.Time))))
			}
		}
	}
	switch {
	case o.MetricsErr != nil:
		rs = append(rs, result(AreaAgents, "sessions", Warning, "cannot read the server's metrics (%s): %v; sessions not counted", o.MetricsFrom, o.MetricsErr))
	case o.Metrics != nil:
		if n, ok := o.Metrics.Value(metricConnectedAgents, nil); !ok {
			rs = append(rs, result(AreaAgents, "sessions", Warning, "the server's metrics have no %s", metricConnectedAgents))
		} else if int(n) > connected {
			rs = append(rs, result(AreaAgents, "sessions", Error, "the server holds %d agent sessions but only %d registered clusters are connected: an agent that is not registered, or a second agent of one cluster, holds a session", int(n), connected))
		} else {
			rs = append(rs, result(AreaAgents, "sessions", OK, "%d agent sessions, one per connected registered cluster", int(n)))
		}
	}
	for i := range o.Workloads {
		rs = append(rs, evalWorkload(o, &o.Workloads[i], registered, now)...)
	}
	return rs
}

func evalClock(kc *multiclusterv1alpha1.KubernetesCluster) []Result {
	off := kc.Status.AgentClockOffset
	if off == nil {
		if kc.Status.Connected {
			return []Result{result(AreaClock, kc.Name, Warning, "the agent has not reported its clock (an agent older than this server?)")}
		}
		return nil
	}
	d := off.Duration
	abs := d
	if abs < 0 {
		abs = -abs
	}
	dir := "ahead of"
	if d < 0 {
		dir = "behind"
	}
	switch {
	case abs >= ClockError:
		return []Result{result(AreaClock, kc.Name, Error, "the agent's clock is %s %s the server's (at most %s is tolerated: certificates are backdated by a minute); fix NTP", abs.Round(time.Millisecond), dir, ClockError)}
	case abs >= ClockWarn:
		return []Result{result(AreaClock, kc.Name, Warning, "the agent's clock is %s %s the server's", abs.Round(time.Millisecond), dir)}
	}
	return []Result{result(AreaClock, kc.Name, OK, "the agent's clock is within %s of the server's (%s)", ClockWarn, d)}
}

func workloadOf(o *Observations, cluster string) *Workload {
	for i := range o.Workloads {
		if o.Workloads[i].Cluster == cluster && o.Workloads[i].Err == nil {
			return &o.Workloads[i]
		}
	}
	return nil
}

func evalWorkload(o *Observations, w *Workload, registered map[string]*multiclusterv1alpha1.KubernetesCluster, now time.Time) []Result {
	subject := w.Cluster
	if subject == "" {
		subject = "context " + w.Context
	}
	if w.Err != nil {
		return []Result{result(AreaAgents, subject, Error, "workload cluster unreachable: %v", w.Err)}
	}
	if w.ConfigErr != nil {
		return []Result{result(AreaAgents, subject, Error, "no agent configuration: %v (register the cluster: relaymesh cluster register)", w.ConfigErr)}
	}
	var rs []Result
	kc := registered[w.Cluster]
	if kc == nil {
		rs = append(rs, result(AreaAgents, subject, Error, "the agent of context %s names cluster %q, which is not registered in the management cluster: it cannot connect (register it, or remove its secrets)", w.Context, w.Cluster))
	}
	if w.RootCAErr != nil {
		rs = append(rs, result(AreaAgents, subject, Error, "cannot read the relay root the agent pins: %v", w.RootCAErr))
	} else if len(o.RelayRoots) > 0 && !overlaps(w.RootCA, o.RelayRoots) {
		rs = append(rs, result(AreaAgents, subject, Error, "the agent pins a relay root that is not the server's: it cannot verify the server (register the cluster again)"))
	}
	switch {
	case w.ClientCertErr != nil && apierrors.IsNotFound(w.ClientCertErr):
		rs = append(rs, result(AreaAgents, subject, Error, "the agent holds no client certificate: it has not bootstrapped (is it running, and is its token valid?)"))
	case w.ClientCertErr != nil:
		rs = append(rs, result(AreaAgents, subject, Error, "cannot read the agent's client certificate: %v", w.ClientCertErr))
	case w.ClientCert != nil:
		c := w.ClientCert
		sev, msg := Expiry(Lifetime{What: "the agent's client certificate", NotBefore: c.NotBefore, NotAfter: c.NotAfter, RenewAt: agentRenewAt}, now)
		rs = append(rs, result(AreaAgents, subject, sev, "%s", msg))
		if len(o.RelayRoots) > 0 {
			inter := x509.NewCertPool()
			if o.SigningCA != nil {
				inter.AddCert(o.SigningCA)
			}
			for _, ca := range o.Server.Chain[min(1, len(o.Server.Chain)):] {
				inter.AddCert(ca)
			}
			if _, err := c.Verify(x509.VerifyOptions{Roots: pool(o.RelayRoots), Intermediates: inter, CurrentTime: c.NotBefore.Add(time.Second),
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
				rs = append(rs, result(AreaAgents, subject, Error, "the agent's client certificate is not from the relay CA: %v", err))
			}
		}
		if kc != nil && kc.Status.AgentCertificate != nil && !strings.EqualFold(kc.Status.AgentCertificate.Serial, fmt.Sprintf("%x", c.SerialNumber)) {
			rs = append(rs, result(AreaAgents, subject, Warning, "the agent holds certificate %x, but the server last issued %s to this cluster", c.SerialNumber, kc.Status.AgentCertificate.Serial))
		}
	}
	switch {
	case w.LeaseErr != nil && apierrors.IsNotFound(w.LeaseErr):
		rs = append(rs, result(AreaAgents, subject, Warning, "no leader-election Lease: cannot tell whether an agent runs here (is leader election off?)"))
	case w.LeaseErr != nil:
		rs = append(rs, result(AreaAgents, subject, Warning, "cannot read the agent's Lease: %v", w.LeaseErr))
	case w.Lease != nil:
		rs = append(rs, evalLease(subject, w, now))
	}
	switch {
	case w.IstioCRDsErr != nil:
		rs = append(rs, result(AreaCRDs, subject, Warning, "cannot list the Istio CRDs: %v", w.IstioCRDsErr))
	case len(w.MissingIstioCRDs) > 0:
		rs = append(rs, result(AreaCRDs, subject, Error, "Istio CRDs the agent applies are missing: %s", strings.Join(w.MissingIstioCRDs, ", ")))
	default:
		rs = append(rs, result(AreaCRDs, subject, OK, "the Istio CRDs the agent applies are installed"))
	}
	return rs
}

func evalLease(subject string, w *Workload, now time.Time) Result {
	holder, age, dur, current := leaseState(w.Lease.Spec, now)
	switch {
	case holder == "" || w.Lease.Spec.RenewTime == nil:
		return result(AreaAgents, subject, Error, "no agent holds the leader Lease %s: none is running", w.Lease.Name)
	case !current:
		return result(AreaAgents, subject, Error, "the agent's leader Lease was last renewed %s ago (it lasts %s): no agent is running", duration.HumanDuration(age), dur)
	}
	return result(AreaAgents, subject, OK, "agent %s holds the leader Lease (renewed %s ago)", holder, duration.HumanDuration(max(age, 0)))
}

func evalVirtualMeshes(o *Observations, now time.Time) []Result {
	if o.VirtualMeshesErr != nil {
		return []Result{result(AreaVirtualMeshes, "virtualmeshes", Error, "cannot list the VirtualMeshes: %v", o.VirtualMeshesErr)}
	}
	var rs []Result
	for i := range o.VirtualMeshes {
		vm := &o.VirtualMeshes[i]
		key := vm.Namespace + "/" + vm.Name
		switch st := vm.Status.State; st {
		case "Invalid", "Failed":
			rs = append(rs, result(AreaVirtualMeshes, key, Error, "%s: %s", st, strings.Join(vm.Status.Errors, "; ")))
		case "":
			rs = append(rs, result(AreaVirtualMeshes, key, Warning, "no status yet: is the server running?"))
		default:
			rs = append(rs, result(AreaVirtualMeshes, key, OK, "%s", st))
		}
		if vm.Spec.MTLS == nil || vm.Spec.MTLS.Shared == nil {
			continue
		}
		rs = append(rs, evalSharedTrust(vm, key, o.Meshes, now)...)
	}
	return rs
}

// evalSharedTrust judges a shared-trust VirtualMesh. A mesh's
// intermediate is judged from the status (what the server last issued),
// else from the cacerts read in its cluster (a restarted server lists only
// what it issued since).
func evalSharedTrust(vm *networkingv1alpha1.VirtualMesh, key string, observed []MeshCA, now time.Time) []Result {
	var rs []Result
	st := vm.Status.SharedTrust
	if st == nil {
		return []Result{result(AreaVirtualMeshes, key, Warning, "shared trust: no root yet")}
	}
	if st.Message != "" {
		rs = append(rs, result(AreaVirtualMeshes, key, Error, "shared trust held: %s", st.Message))
	}
	if st.RootNotAfter != nil {
		sev, msg := Expiry(Lifetime{What: "root " + st.RootSubject, NotAfter: st.RootNotAfter.Time}, now)
		rs = append(rs, result(AreaVirtualMeshes, key, sev, "%s", msg))
	}
	renewAt := defaultIntermediateRenewAt
	if opts := vm.Spec.MTLS.Shared.IntermediateOptions; opts != nil && opts.RenewAtPercent > 0 {
		renewAt = float64(opts.RenewAtPercent) / 100
	}
	issued := map[string]bool{}
	for _, m := range st.Meshes {
		issued[m.Mesh] = true
		sev, msg := Expiry(Lifetime{What: "the intermediate of " + m.Cluster + "'s mesh", NotBefore: m.NotBefore.Time, NotAfter: m.NotAfter.Time, RenewAt: renewAt}, now)
		rs = append(rs, result(AreaVirtualMeshes, key+" "+m.Cluster, sev, "%s", msg))
	}
	var missing []string
	for _, ref := range vm.Spec.Meshes {
		if issued[discoveryv1alpha1.Name(discoveryv1alpha1.OriginMesh, ref.ClusterName, ref.Namespace, ref.Name)] {
			continue
		}
		i := slices.IndexFunc(observed, func(m MeshCA) bool {
			return m.VirtualMesh == key && m.Cluster == ref.ClusterName && m.Namespace == ref.Namespace && m.Intermediate != nil
		})
		if i < 0 {
			missing = append(missing, ref.ClusterName+"/"+ref.Namespace+"/"+ref.Name)
			continue
		}
		c := observed[i].Intermediate
		sev, msg := Expiry(Lifetime{What: "the intermediate of " + ref.ClusterName + "'s mesh (from its cacerts)", NotBefore: c.NotBefore, NotAfter: c.NotAfter, RenewAt: renewAt}, now)
		rs = append(rs, result(AreaVirtualMeshes, key+" "+ref.ClusterName, sev, "%s", msg))
	}
	if len(missing) > 0 {
		rs = append(rs, result(AreaVirtualMeshes, key, Warning, "no intermediate issued yet to %s", strings.Join(missing, ", ")))
	}
	rot := vm.Status.Rotation
	switch {
	case rot == nil || rot.Phase == networkingv1alpha1.PhaseNotRotating:
		rs = append(rs, result(AreaVirtualMeshes, key, OK, "rotation: not rotating"))
	case rot.Phase == networkingv1alpha1.PhaseFailed:
		rs = append(rs, result(AreaVirtualMeshes, key, Error, "rotation failed: %s", rot.Message))
	case rot.AwaitingContinue:
		rs = append(rs, result(AreaVirtualMeshes, key, Warning, "rotation in %s (step %d) awaits 'relaymesh ca rotate continue %s' after you verified traffic", rot.Phase, rot.Step, key))
	case trust.Rotating(rot.Phase):
		msg := fmt.Sprintf("rotation in %s (step %d)", rot.Phase, rot.Step)
		if len(rot.PendingMeshes) > 0 {
			msg += ", waiting for " + strings.Join(rot.PendingMeshes, ", ")
		}
		rs = append(rs, result(AreaVirtualMeshes, key, Warning, "%s", msg))
	case rot.Phase == networkingv1alpha1.PhaseRolledBack:
		rs = append(rs, result(AreaVirtualMeshes, key, Warning, "the last rotation was rolled back: the old root is in force"))
	default:
		rs = append(rs, result(AreaVirtualMeshes, key, OK, "rotation: %s", rot.Phase))
	}
	return rs
}

// evalTrustDomains reports what makes a trust domain unsafe or unusable:
// one granted to several clusters without every holder marking it shared
// (no mesh of theirs gets an intermediate), one shared (WEAKER), a mesh
// reporting a trust domain outside its cluster's grant, and one trust
// domain reported by several meshes.
func evalTrustDomains(o *Observations) []Result {
	switch {
	case o.ClustersErr != nil:
		return nil // evalAgents reports it
	case o.DiscoveredErr != nil:
		return []Result{result(AreaTrustDomains, "meshes", Warning, "cannot list the discovered Meshes: %v; trust domains not checked", o.DiscoveredErr)}
	}
	grants := translation.NewGrants(o.Clusters)
	var rs []Result
	// Grants: each trust domain once.
	seen := map[string]bool{}
	for i := range o.Clusters {
		for _, td := range grants.Granted(o.Clusters[i].Name) {
			if seen[td] {
				continue
			}
			seen[td] = true
			var ge *translation.GrantError
			if err := grants.Authorize(o.Clusters[i].Name, td); errors.As(err, &ge) {
				rs = append(rs, result(AreaTrustDomains, td, Error, "%v", err))
			} else if others := grants.SharedWith(o.Clusters[i].Name, td); len(others) > 0 {
				rs = append(rs, result(AreaTrustDomains, td, Warning, "shared by clusters %s (WEAKER: the meshes of each can sign the others' identities)",
					strings.Join(append([]string{o.Clusters[i].Name}, others...), ", ")))
			}
		}
	}
	// Reports: what each mesh's agent says, against its cluster's grant.
	byTD := map[string][]*discoveryv1alpha1.Mesh{}
	ok := 0
	for i := range o.Discovered {
		m := &o.Discovered[i]
		ist := m.Spec.Istio
		if ist == nil || ist.Installation.Cluster == "" {
			continue
		}
		subject := "mesh " + meshLabel(m)
		if ist.TrustDomain == "" {
			rs = append(rs, result(AreaTrustDomains, subject, Error, "reports no trust domain: it gets no intermediate"))
			continue
		}
		byTD[ist.TrustDomain] = append(byTD[ist.TrustDomain], m)
		var ge *translation.GrantError
		switch err := grants.Authorize(ist.Installation.Cluster, ist.TrustDomain); {
		case errors.As(err, &ge) && ge.Reason == translation.RefusedConflict:
			// Reported once, on the trust domain, above.
		case err != nil:
			rs = append(rs, result(AreaTrustDomains, subject, Error, "reports trust domain %q: %v; it gets no intermediate and every VirtualMesh naming it is Invalid", ist.TrustDomain, err))
		default:
			ok++
		}
	}
	for _, td := range slices.Sorted(maps.Keys(byTD)) {
		ms := byTD[td]
		if len(ms) < 2 {
			continue
		}
		names, clusters := make([]string, len(ms)), map[string]bool{}
		for i, m := range ms {
			names[i] = meshLabel(m)
			clusters[m.Spec.Istio.Installation.Cluster] = true
		}
		slices.Sort(names)
		sev, why := Warning, "either's CA can sign the others' identities"
		if len(clusters) > 1 && len(grants.SharedWith(ms[0].Spec.Istio.Installation.Cluster, td)) == 0 {
			// Not an administrator's shared grant: at most one of them can
			// be the trust domain's rightful mesh.
			sev, why = Error, "at most one cluster can hold it: the others are refused, or all are when the grant is held twice"
		}
		rs = append(rs, result(AreaTrustDomains, td, sev, "claimed by %d meshes (%s): %s", len(ms), strings.Join(names, ", "), why))
	}
	if len(rs) == 0 && ok > 0 {
		rs = append(rs, result(AreaTrustDomains, "meshes", OK, "%d mesh(es), each reporting a trust domain its cluster is granted alone", ok))
	}
	return rs
}

// meshLabel is how a discovered mesh reads: its control plane,
// cluster/namespace/name.
func meshLabel(m *discoveryv1alpha1.Mesh) string {
	inst := m.Spec.Istio.Installation
	return inst.Cluster + "/" + inst.Namespace + "/" + inst.Name
}

func evalIstiod(o *Observations) []Result {
	var rs []Result
	for _, m := range o.Meshes {
		subject := m.Cluster + "/" + m.Namespace
		switch {
		case !m.Reachable:
			rs = append(rs, result(AreaIstiod, subject, Warning, "no credentials for cluster %s (no context of that name; give --remote-context): cannot check that istiod uses the CA of %s", m.Cluster, m.VirtualMesh))
			continue
		case m.CACertsErr != nil && apierrors.IsNotFound(m.CACertsErr):
			rs = append(rs, result(AreaIstiod, subject, Error, "no cacerts Secret: the agent has not written the mesh's CA for %s", m.VirtualMesh))
			continue
		case m.CACertsErr != nil:
			rs = append(rs, result(AreaIstiod, subject, Error, "cannot read cacerts: %v", m.CACertsErr))
			continue
		case m.Intermediate == nil:
			rs = append(rs, result(AreaIstiod, subject, Error, "cacerts holds no intermediate"))
			continue
		}
		if m.TrustDomain != "" {
			if err := (&trust.MeshCA{Intermediate: m.Intermediate}).CheckTrustDomain(m.TrustDomain); err != nil {
				rs = append(rs, result(AreaIstiod, subject, Error, "cacerts: %v", err))
			}
		}
		switch {
		case m.IstiodRootsErr != nil && apierrors.IsNotFound(m.IstiodRootsErr):
			rs = append(rs, result(AreaIstiod, subject, Error, "istiod has not published its root (ConfigMap istio-ca-root-cert in %s): is istiod running?", m.Namespace))
		case m.IstiodRootsErr != nil:
			rs = append(rs, result(AreaIstiod, subject, Error, "cannot read istiod's root (istio-ca-root-cert): %v", m.IstiodRootsErr))
		case !sameCerts(m.IstiodRoots, m.Roots):
			rs = append(rs, result(AreaIstiod, subject, Error, "istiod is not using the cacerts Relaymesh wrote: it publishes roots %s, cacerts holds %s; restart istiod (kubectl -n %s rollout restart deployment/istiod)",
				fingerprints(m.IstiodRoots), fingerprints(m.Roots), m.Namespace))
		default:
			rs = append(rs, result(AreaIstiod, subject, OK, "istiod uses the cacerts of %s (roots %s)", m.VirtualMesh, fingerprints(m.Roots)))
		}
	}
	return rs
}

func evalWebhook(o *Observations) []Result {
	w := o.Webhook
	const subject = "relaymesh-admission"
	switch {
	case w.ConfigErr != nil:
		return []Result{result(AreaWebhook, subject, Error, "cannot read the ValidatingWebhookConfiguration: %v", w.ConfigErr)}
	case w.NotFound || w.Config == nil:
		return []Result{result(AreaWebhook, subject, Warning, "no admission webhook registered (server without --webhook-listen): objects the rules refuse are created, then marked Invalid and not translated")}
	}
	var rs []Result
	for _, h := range w.Config.Webhooks {
		fp := admissionregistrationv1.Fail
		if h.FailurePolicy != nil {
			fp = *h.FailurePolicy
		}
		if fp == admissionregistrationv1.Ignore {
			rs = append(rs, result(AreaWebhook, subject, Warning, "failure policy Ignore (WEAKER): while the webhook is down, changes the rules refuse pass (they are marked Invalid later)"))
		} else {
			rs = append(rs, result(AreaWebhook, subject, OK, "failure policy %s: while the webhook is down, changes are refused", fp))
		}
	}
	switch {
	case !w.DryRunRan:
	case w.DryRunErr == nil:
		rs = append(rs, result(AreaWebhook, subject, OK, "the apiserver reaches the webhook (a dry-run create was admitted)"))
	case webhookDenied(w.DryRunErr):
		rs = append(rs, result(AreaWebhook, subject, OK, "the apiserver reaches the webhook (a dry-run create was judged)"))
	default:
		rs = append(rs, result(AreaWebhook, subject, Error, "the apiserver cannot call the webhook: %v", w.DryRunErr))
	}
	switch {
	case o.Metrics == nil:
		rs = append(rs, result(AreaWebhook, subject, Warning, "cannot tell whether the webhook authenticates the apiserver: the server's metrics are not readable"))
	default:
		auth, ok := o.Metrics.Label(metricWebhookInfo, "client_auth")
		switch {
		case !ok:
			rs = append(rs, result(AreaWebhook, subject, Warning, "the server reports no webhook (%s): a webhook is registered but this server does not serve it", metricWebhookInfo))
		case auth == "certificate":
			rs = append(rs, result(AreaWebhook, subject, OK, "the webhook answers only the apiserver's client certificate (--webhook-client-ca)"))
		default:
			rs = append(rs, result(AreaWebhook, subject, Warning, "the webhook answers callers without a client certificate (--webhook-allow-unauthenticated, WEAKER): give it --webhook-client-ca"))
		}
	}
	return rs
}

// evalDashboard reports how the web dashboard is served: over plain HTTP
// off loopback, anyone on the path reads the session cookie.
func evalDashboard(o *Observations) []Result {
	const subject = "transport"
	d := o.Dashboard
	switch {
	case o.MetricsErr != nil:
		return nil // reported with the agents: the metrics could not be read
	case !d.Served:
		return []Result{result(AreaDashboard, subject, OK, "the server serves no dashboard (no --dashboard-listen)")}
	case d.TLS == "none" && d.Listener == "loopback":
		return []Result{result(AreaDashboard, subject, Warning, "served over plain HTTP on loopback (--dashboard-plain-http, WEAKER): reachable only through a port-forward, and its session cookie is not Secure; drop the flag to serve TLS")}
	case d.TLS == "none":
		return []Result{result(AreaDashboard, subject, Error, "served over plain HTTP off loopback (%s listener): anyone on the path reads sign-in tokens and session cookies; serve it over TLS (drop --dashboard-plain-http)", d.Listener)}
	case d.TLS == "relay-ca":
		return []Result{result(AreaDashboard, subject, OK, "served over TLS with a certificate from the relay CA (%s listener)", d.Listener)}
	case d.TLS == "files":
		return []Result{result(AreaDashboard, subject, OK, "served over TLS with the provided certificate (--dashboard-tls-cert, %s listener)", d.Listener)}
	}
	return []Result{result(AreaDashboard, subject, Warning, "the server reports the dashboard's transport as %q, which this relaymesh does not know", d.TLS)}
}

// webhookDenied reports whether the apiserver's error is the webhook's
// verdict (so the webhook was reached), not a failure to call it.
func webhookDenied(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "denied the request") && !strings.Contains(msg, "failed calling webhook")
}

func pool(certs []*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}

func overlaps(a, b []*x509.Certificate) bool {
	for _, c := range a {
		if slices.ContainsFunc(b, c.Equal) {
			return true
		}
	}
	return false
}

// sameCerts reports whether a and b hold the same certificates, in any order.
func sameCerts(a, b []*x509.Certificate) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	for _, c := range a {
		if !slices.ContainsFunc(b, c.Equal) {
			return false
		}
	}
	for _, c := range b {
		if !slices.ContainsFunc(a, c.Equal) {
			return false
		}
	}
	return true
}

func fingerprints(certs []*x509.Certificate) string {
	var fps []string
	for _, c := range certs {
		fps = append(fps, trust.ShortFingerprint(trust.Fingerprint(c))+"…")
	}
	sort.Strings(fps)
	if len(fps) == 0 {
		return "(none)"
	}
	return "[" + strings.Join(fps, " ") + "]"
}
