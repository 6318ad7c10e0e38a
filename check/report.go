// Package check finds what is broken in a Relaymesh installation, the way
// `meshctl check` does, but never reports green on a broken setup: a fact
// it cannot observe is a warning, not a pass.
//
// A run has two halves. Gather (I/O) reads the management cluster, the
// workload clusters it has credentials for, the relay server's port and its
// metrics into Observations. Evaluate (pure) turns Observations and the
// current time into Results, each with a severity; the Report's exit code
// is 0 when every result is OK, 1 with warnings, 2 with errors. Every
// decision is a function of the observations and now, table-tested without
// a cluster; the gatherers are tested against real clusters with each
// failure made real.
//
// What is checked:
//   - CRDs: every Relaymesh CRD installed, established, serving and storing
//     the version this binary speaks, with this binary's schema; the Istio
//     CRDs the agent applies, in each workload cluster.
//   - Relay server: reachable at its relay address, serving a certificate
//     that chains to the relay root and is not near expiry.
//   - Relay CA: roots and issuing CA with days to expiry (warning < 30
//     days, error < 7).
//   - Agents: every registered cluster's agent connected; no agent holding
//     a session that is not registered (sessions the server counts beyond
//     the connected registered clusters; a workload cluster whose agent
//     names a cluster that is not registered); the agent's leader Lease
//     renewed; its client certificate chaining to the relay root, matching
//     what the server issued, and not near expiry; its clock's offset from
//     the server's.
//   - VirtualMeshes: state, rotation phase and the meshes it waits for, root
//     and intermediates with days to expiry, and for each mesh whether
//     istiod actually uses the cacerts Relaymesh wrote (its
//     istio-ca-root-cert ConfigMap holds exactly the cacerts roots) and the
//     intermediate is name-constrained to the mesh's trust domain.
//   - Federation: each FederatedTrustDomain of the server's namespace (a
//     foreign trust domain the Lease holder imports): Invalid an error;
//     Stale, Pending, or a last fetch older than twice its clamped refresh
//     hint plus FetchSlack a warning; each accepted root under 7 days to
//     expiry a warning, expired an error (Lifetime.Foreign).
//   - Admission webhook: registered, reachable by the apiserver (a
//     server-side dry run), its failure policy, and whether it answers only
//     the apiserver's client certificate.
//   - Ambient pitfalls, from each workload cluster's own objects (namespaces,
//     pods, Services, AuthorizationPolicies, waypoint Gateways,
//     VirtualServices, HTTPRoutes, GRPCRoutes and TCPRoutes; a kind the cluster does
//     not serve is nothing to check): an AuthorizationPolicy ztunnel
//     enforces on ambient pods that holds HTTP attributes (ALLOW: an error,
//     the rules are dropped and what they allow is denied; DENY: a warning,
//     widened to L4); a headless Service bound to a waypoint for Service
//     traffic (clients bypass it); a Service routed by both a VirtualService
//     and a Gateway API route; an AuthorizationPolicy whose target is
//     a Service no waypoint serves (enforced nowhere: fail open). Each names whose the objects are:
//     Relaymesh's (label relaymesh.io/owner) or the user's.
//   - Across each VirtualMesh's member clusters that were read: an Istio
//     remote secret (label istio/multiCluster=true; listed as metadata:
//     its data is never requested) is an error: another control plane's
//     credentials in a federated cluster, which Relaymesh's relay exists to
//     avoid; a Service that several member clusters hold (namespace
//     sameness) and that their waypoints serve differently (bound in one
//     and not another, differently named, absent where bound, or serving
//     other traffic) is a warning: Istio's ambient multicluster requires
//     identical waypoints wherever a service is global.
package check

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Severity of a result.
type Severity int

// Severities, in increasing order.
const (
	OK Severity = iota
	Warning
	Error
)

func (s Severity) String() string {
	switch s {
	case OK:
		return "ok"
	case Warning:
		return "warning"
	}
	return "error"
}

// MarshalText implements encoding.TextMarshaler.
func (s Severity) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *Severity) UnmarshalText(b []byte) error {
	switch string(b) {
	case "ok":
		*s = OK
	case "warning":
		*s = Warning
	case "error":
		*s = Error
	default:
		return fmt.Errorf("unknown severity %q", b)
	}
	return nil
}

// Areas of results.
const (
	AreaCRDs          = "crds"
	AreaServer        = "server"
	AreaRelayCA       = "relay-ca"
	AreaAgents        = "agents"
	AreaClock         = "clock"
	AreaVirtualMeshes = "virtualmeshes"
	AreaTrustDomains  = "trust-domains"
	AreaFederation    = "federation"
	AreaIstiod        = "istiod"
	AreaWebhook       = "webhook"
	AreaDashboard     = "dashboard"
	AreaAmbient       = "ambient"
)

// Result is one finding.
type Result struct {
	Area     string   `json:"area"`
	Subject  string   `json:"subject"`
	Severity Severity `json:"severity"`
	Message  string   `json:"message"`
}

// Summary counts results by severity.
type Summary struct {
	OK       int `json:"ok"`
	Warnings int `json:"warnings"`
	Errors   int `json:"errors"`
}

// Report is the outcome of a run.
type Report struct {
	Time    time.Time `json:"time"`
	Summary Summary   `json:"summary"`
	Results []Result  `json:"results"`
}

// NewReport sorts results (by area order, then subject) and counts them.
func NewReport(now time.Time, results []Result) *Report {
	order := map[string]int{}
	for i, a := range []string{AreaCRDs, AreaServer, AreaRelayCA, AreaAgents, AreaClock, AreaVirtualMeshes, AreaTrustDomains, AreaFederation, AreaIstiod, AreaWebhook, AreaDashboard, AreaAmbient} {
		order[a] = i
	}
	sort.SliceStable(results, func(i, j int) bool {
		if order[results[i].Area] != order[results[j].Area] {
			return order[results[i].Area] < order[results[j].Area]
		}
		return results[i].Subject < results[j].Subject
	})
	r := &Report{Time: now.UTC(), Results: results}
	if r.Results == nil {
		r.Results = []Result{}
	}
	for _, res := range results {
		switch res.Severity {
		case OK:
			r.Summary.OK++
		case Warning:
			r.Summary.Warnings++
		default:
			r.Summary.Errors++
		}
	}
	return r
}

// Severity is the worst severity of the report.
func (r *Report) Severity() Severity {
	switch {
	case r.Summary.Errors > 0:
		return Error
	case r.Summary.Warnings > 0:
		return Warning
	}
	return OK
}

// ExitCode is 0 (all OK), 1 (warnings) or 2 (errors).
func (r *Report) ExitCode() int { return int(r.Severity()) }

// Columns implements printer.Tabular.
func (r *Report) Columns(bool) []string {
	return []string{"STATUS", "AREA", "SUBJECT", "MESSAGE"}
}

// Rows implements printer.Tabular: every result, worst areas first as
// they were sorted.
func (r *Report) Rows(bool) [][]string {
	var rows [][]string
	for _, res := range r.Results {
		rows = append(rows, []string{strings.ToUpper(res.Severity.String()), res.Area, res.Subject, res.Message})
	}
	return rows
}

// Line is the one-line verdict printed after the table.
func (r *Report) Line() string {
	return fmt.Sprintf("%d ok, %d warnings, %d errors", r.Summary.OK, r.Summary.Warnings, r.Summary.Errors)
}
