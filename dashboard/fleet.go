package dashboard

import (
	"fmt"
	"sort"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
)

// Agents is the server's live picture of the agents it serves (the relay's
// View): when each cluster's last snapshot arrived and what its agent last
// acknowledged. Implementations MUST be safe for concurrent use.
type Agents interface {
	Agents() map[string]AgentState
}

// AgentState is what the server holds of one cluster's agent right now.
type AgentState struct {
	// SnapshotAt is when its last discovery snapshot was accepted.
	SnapshotAt time.Time
	// SnapshotError says why its latest snapshot was refused, if it was.
	SnapshotError string
	// AckVersion and AckedAt: the output version its agent last applied.
	AckVersion uint64
	AckedAt    time.Time
	// Failures are the outputs that did not apply, as "kind ns/name: error".
	Failures []string
}

// Thresholds of the fleet's readiness problems.
const (
	// maxClockOffset: beyond it, certificate validity checks between the
	// agent and the server may fail.
	maxClockOffset = 30 * time.Second
	// maxListedFailures: failed outputs listed per cluster.
	maxListedFailures = 5
)

// Cluster is one row of the fleet.
type Cluster struct {
	Name        string    `json:"name"`
	Mode        string    `json:"mode"`
	Connected   bool      `json:"connected"`
	LastSeen    time.Time `json:"lastSeen,omitzero"`
	LastSeenAgo string    `json:"lastSeenAgo"`
	// HeldBy is the live server replica holding the agent's session (then
	// LastSeen is that replica's last Lease renewal; see LastSeen).
	HeldBy       string    `json:"heldBy,omitempty"`
	AgentVersion string    `json:"agentVersion,omitempty"`
	ClockOffset  string    `json:"clockOffset,omitempty"`
	CertSerial   string    `json:"certificateSerial,omitempty"`
	CertExpiry   time.Time `json:"certificateExpiry,omitzero"`
	CertLeft     string    `json:"certificateLeft,omitempty"`
	CertBand     string    `json:"certificateBand,omitempty"`
	SnapshotAt   time.Time `json:"snapshotAt,omitzero"`
	SnapshotAge  string    `json:"snapshotAge"`
	AckVersion   uint64    `json:"appliedVersion,omitempty"`
	AppliedAgo   string    `json:"appliedAgo"`
	// Apply is the last apply result: "applied", "N failed", "none yet".
	Apply    string   `json:"apply"`
	Failures []string `json:"failures,omitempty"`
	// Problems say why the cluster is not ready; none: it is.
	Problems []string `json:"problems"`
	Ready    bool     `json:"ready"`
}

// fleetInput is what the fleet is built from.
type fleetInput struct {
	clusters []multiclusterv1alpha1.KubernetesCluster
	agents   map[string]AgentState
	// replicas are the live server replicas' last Lease renewals (nil:
	// unknown).
	replicas      map[string]time.Time
	serverVersion string
	agentTTL      time.Duration
	now           time.Time
}

// fleet builds the fleet table, clusters with problems first.
func fleet(in fleetInput) []Cluster {
	out := make([]Cluster, 0, len(in.clusters))
	for _, kc := range in.clusters {
		st := kc.Status
		c := Cluster{Name: kc.Name, Mode: string(kc.Spec.Mode), Connected: st.Connected, AgentVersion: st.AgentVersion, Problems: []string{}}
		if c.Mode == "" {
			c.Mode = string(multiclusterv1alpha1.ModeRelay)
		}
		heard := LastSeen(st, in.replicas, in.now)
		c.LastSeen, c.HeldBy, c.LastSeenAgo = heard.At, heard.HeldBy, SeenAgo(heard, in.now)
		if st.AgentClockOffset != nil {
			c.ClockOffset = st.AgentClockOffset.Duration.String()
			if off := st.AgentClockOffset.Duration; off > maxClockOffset || off < -maxClockOffset {
				c.Problems = append(c.Problems, fmt.Sprintf("agent clock is off by %s (more than %s): certificate validity checks may fail", off, maxClockOffset))
			}
		}
		switch {
		case st.Connected:
		case c.LastSeen.IsZero():
			c.Problems = append(c.Problems, "agent never connected")
		default:
			c.Problems = append(c.Problems, "agent not connected (last seen "+c.LastSeenAgo+")")
		}
		if ac := st.AgentCertificate; ac != nil {
			c.CertSerial, c.CertExpiry = ac.Serial, ac.NotAfter.UTC()
			c.CertLeft = left(c.CertExpiry, in.now)
			var notBefore time.Time
			if in.agentTTL > 0 {
				notBefore = c.CertExpiry.Add(-in.agentTTL)
			}
			c.CertBand = Band(notBefore, c.CertExpiry, in.now, true)
			switch c.CertBand {
			case BandExpired:
				c.Problems = append(c.Problems, "agent certificate expired "+ago(c.CertExpiry, in.now))
			case BandCritical, BandWarning:
				c.Problems = append(c.Problems, "agent certificate not renewed, expires in "+c.CertLeft)
			}
		}
		if in.serverVersion != "" && st.AgentVersion != "" && st.AgentVersion != in.serverVersion {
			c.Problems = append(c.Problems, "agent version "+st.AgentVersion+" differs from the server's "+in.serverVersion)
		}
		a, seen := in.agents[kc.Name]
		c.SnapshotAt, c.SnapshotAge = a.SnapshotAt, ago(a.SnapshotAt, in.now)
		if a.SnapshotError != "" {
			c.Problems = append(c.Problems, "last snapshot refused: "+a.SnapshotError)
		}
		if st.Connected && (!seen || a.SnapshotAt.IsZero()) {
			c.Problems = append(c.Problems, "no discovery snapshot from the agent yet")
		}
		c.AckVersion, c.AppliedAgo = a.AckVersion, ago(a.AckedAt, in.now)
		switch {
		case a.AckedAt.IsZero():
			c.Apply = "none yet"
		case len(a.Failures) > 0:
			c.Apply = fmt.Sprintf("%d failed", len(a.Failures))
			c.Failures = a.Failures[:min(len(a.Failures), maxListedFailures)]
			c.Problems = append(c.Problems, fmt.Sprintf("%d output(s) of version %d not applied", len(a.Failures), a.AckVersion))
		default:
			c.Apply = "applied"
		}
		c.Ready = len(c.Problems) == 0
		out = append(out, c)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Ready != out[j].Ready {
			return !out[i].Ready
		}
		return out[i].Name < out[j].Name
	})
	return out
}
