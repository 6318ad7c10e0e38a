package main

import (
	"fmt"
	"sort"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/dashboard"
	"github.com/relaymesh/relaymesh/internal/printer"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/duration"
)

// clusterInfo is one registered cluster as cluster list shows it.
type clusterInfo struct {
	Name       string    `json:"name"`
	Mode       string    `json:"mode"`
	Registered time.Time `json:"registered"`
	Connected  bool      `json:"connected"`
	// LastSeen is when the agent was last heard: while a live replica
	// holds its session (HeldBy), that replica's last Lease renewal, else
	// the session's last recorded event (dashboard.LastSeen).
	LastSeen      *time.Time `json:"lastSeen,omitempty"`
	HeldBy        string     `json:"heldBy,omitempty"`
	CertSerial    string     `json:"certificateSerial,omitempty"`
	SPIFFEID      string     `json:"spiffeID,omitempty"`
	CertNotAfter  *time.Time `json:"certificateNotAfter,omitempty"`
	AgentVersion  string     `json:"agentVersion,omitempty"`
	ClockOffset   string     `json:"agentClockOffset,omitempty"`
	ClusterDomain string     `json:"clusterDomain,omitempty"`
}

// clusterList is what cluster list prints.
type clusterList struct {
	Clusters []clusterInfo `json:"clusters"`
	now      time.Time
}

func (l clusterList) Columns(wide bool) []string {
	cols := []string{"NAME", "MODE", "REGISTERED", "CONNECTED", "LAST SEEN", "CERT EXPIRES", "AGENT VERSION"}
	if wide {
		cols = append(cols, "CLOCK OFFSET", "DOMAIN", "SERIAL", "SPIFFE ID")
	}
	return cols
}

func (l clusterList) Rows(wide bool) [][]string {
	var rows [][]string
	for _, c := range l.Clusters {
		connected := "no"
		if c.Connected {
			connected = "yes"
		}
		seen := ago(l.now, c.LastSeen)
		if c.HeldBy != "" {
			seen = "now (replica " + c.HeldBy + ")"
		}
		r := []string{c.Name, c.Mode, ago(l.now, &c.Registered), connected, seen, until(l.now, c.CertNotAfter), c.AgentVersion}
		if wide {
			r = append(r, c.ClockOffset, c.ClusterDomain, c.CertSerial, c.SPIFFEID)
		}
		rows = append(rows, r)
	}
	return rows
}

// ago is "5m ago" (kubectl's short durations), or "" for no time.
func ago(now time.Time, t *time.Time) string {
	if t == nil || t.IsZero() {
		return ""
	}
	return duration.HumanDuration(now.Sub(*t)) + " ago"
}

// until is "in 23h" or "expired 5m ago".
func until(now time.Time, t *time.Time) string {
	if t == nil || t.IsZero() {
		return ""
	}
	if d := t.Sub(now); d > 0 {
		return "in " + duration.HumanDuration(d)
	}
	return "expired " + duration.HumanDuration(now.Sub(*t)) + " ago"
}

func newClusterListCommand(d deps, g *globals) *cobra.Command {
	var output string
	c := &cobra.Command{
		Use:   "list",
		Short: "List registered clusters: registration, connection, certificate expiry, versions",
		Long: `List the KubernetesClusters of --namespace in the management cluster with
what the server recorded of each agent: whether it holds a session, when it
was last heard, its client certificate's expiry, the version it reported,
and (-o wide) how far its clock was from the server's when it connected.

An idle session records nothing, so while a live server replica holds the
agent's session LAST SEEN says "now (replica NAME)" (JSON: lastSeen is that
replica's last Lease renewal, a few seconds ago; the server's keepalive ends
a session whose agent stopped answering within 40s); otherwise it is the
session's last recorded event. Reading the replicas' Leases needs list on
leases in --namespace; without it, and with the server's leader election
off, it is the last recorded event.`,
		Example: `  relaymesh cluster list --context mgmt
  relaymesh cluster list -o wide
  relaymesh cluster list -o json | jq '.clusters[] | select(.connected | not) | .name'`,
		Aliases: []string{"ls"},
		Args:    noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			format, kube, err := formatAndClients(g, output)
			if err != nil {
				return err
			}
			kcs, err := listAs[multiclusterv1alpha1.KubernetesCluster](c.Context(), kube.Dynamic, multiclusterv1alpha1.KubernetesClusters, g.namespace)
			if err != nil {
				return err
			}
			list := clusterList{Clusters: []clusterInfo{}, now: d.now()}
			replicas, _ := liveReplicas(kube.Typed, g.namespace)(c.Context())
			for _, kc := range kcs {
				list.Clusters = append(list.Clusters, describeCluster(kc, replicas, list.now))
			}
			sort.Slice(list.Clusters, func(i, j int) bool { return list.Clusters[i].Name < list.Clusters[j].Name })
			if len(list.Clusters) == 0 && (format == printer.Table || format == printer.Wide) {
				fmt.Fprintf(d.stderr, "no clusters registered in namespace %s\n", g.namespace)
				return nil
			}
			return printer.Print(d.stdout, format, list)
		},
	}
	outputFlag(c, &output, printer.Formats)
	return c
}

// describeCluster is kc's row, with the live replicas' last Lease renewals
// (nil: unknown) at now.
func describeCluster(kc multiclusterv1alpha1.KubernetesCluster, replicas map[string]time.Time, now time.Time) clusterInfo {
	info := clusterInfo{Name: kc.Name, Mode: string(kc.Spec.Mode), Registered: kc.CreationTimestamp.UTC(),
		Connected: kc.Status.Connected, AgentVersion: kc.Status.AgentVersion, ClusterDomain: kc.Spec.ClusterDomain}
	if seen := dashboard.LastSeen(kc.Status, replicas, now); !seen.At.IsZero() {
		info.LastSeen, info.HeldBy = &seen.At, seen.HeldBy
	}
	if c := kc.Status.AgentCertificate; c != nil {
		t := c.NotAfter.UTC()
		info.CertNotAfter, info.CertSerial, info.SPIFFEID = &t, c.Serial, c.SPIFFEID
	}
	if o := kc.Status.AgentClockOffset; o != nil {
		info.ClockOffset = o.Duration.String()
	}
	return info
}
