package fleet_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/test/fleet"
	"github.com/stretchr/testify/require"
)

// Sizes default to what CI can afford; the big runs pass them by hand, e.g.
//
//	go test ./test/fleet -run '^$' -bench Storm -benchtime 1x -timeout 2h \
//	  -fleet.bin /work/baseline/relaymesh -fleet.agents 1000 -fleet.status-after 25s
var (
	agentsFlag      = flag.Int("fleet.agents", 20, "agents in BenchmarkFleetStorm")
	idleFlag        = flag.Int("fleet.idle-agents", 20, "agents in BenchmarkFleetIdle")
	clustersFlag    = flag.Int("fleet.clusters", 10, "clusters in BenchmarkFleetConfigPlane")
	editsFlag       = flag.Int("fleet.edits", 3, "policy edits in BenchmarkFleetConfigPlane")
	configReplicas  = flag.Int("fleet.config-replicas", 1, "server replicas in BenchmarkFleetConfigPlane")
	statusAfterFlag = flag.Duration("fleet.status-after", 5*time.Second, "wait after a storm before KubernetesCluster statuses are read")
	settleFlag      = flag.Duration("fleet.settle", 5*time.Second, "idle time before and during the idle measurement")
	durationFlag    = flag.Duration("fleet.duration", 2*time.Second, "measured window of each issuance level")
	concFlag        = flag.String("fleet.concurrency", "1,4,16", "issuance concurrency levels")
	backendsFlag    = flag.String("fleet.backends", "relaymesh,cfssl,step-ca,step-ca-badgerv2,x509", "issuance back ends")
	failoverFlag    = flag.Int("fleet.failover-agents", 100, "agents in BenchmarkFleetFailover")
	steadyFlag      = flag.Duration("fleet.steady", 20*time.Second, "steady window of BenchmarkFleetFailover")
	lifetimeFlag    = flag.Int("fleet.lifetime-agents", 40, "agents in BenchmarkFleetLifetime")
	lifetimeTTLFlag = flag.Duration("fleet.lifetime-agent-ttl", time.Minute, "--agent-cert-ttl in BenchmarkFleetLifetime")
	lifetimeCAFlag  = flag.Duration("fleet.lifetime-issuer-ttl", 240*time.Second, "--relay-issuer-ttl in BenchmarkFleetLifetime (renewed at 0.35 of its life)")
	reportFlag      = flag.String("fleet.report", "", "write each benchmark's full result as JSON to this file prefix (<prefix>-<benchmark>.json)")
)

func options(b *testing.B, env *fleet.Env) fleet.Options {
	return fleet.Options{Env: env, Logf: b.Logf}
}

// report writes v as JSON when -fleet.report is set and logs it.
func report(b *testing.B, v any) {
	js, err := json.MarshalIndent(v, "", "  ")
	require.NoError(b, err)
	if *reportFlag != "" {
		name := strings.NewReplacer("/", "-", " ", "-").Replace(b.Name())
		require.NoError(b, os.WriteFile(*reportFlag+"-"+name+".json", js, 0o600))
	}
	b.Logf("%s", js)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkFleetStorm: -fleet.agents agents with fresh tokens start at once
// against one server; token → certified → first session per agent, the
// time until every session is open, and KubernetesCluster statuses
// -fleet.status-after later.
func BenchmarkFleetStorm(b *testing.B) {
	env := startEnv(b)
	var r *fleet.StormResult
	for b.Loop() {
		var err error
		r, err = fleet.Storm(context.Background(), fleet.StormConfig{Options: options(b, env), Agents: *agentsFlag, StatusAfter: *statusAfterFlag})
		require.NoError(b, err)
	}
	report(b, r)
	require.Zero(b, r.NotConnected, "every agent got a session")
	b.ReportMetric(float64(r.Agents), "agents")
	b.ReportMetric(r.AllSessions.Seconds(), "s-all-sessions")
	b.ReportMetric(ms(r.Session.P50), "ms-session-p50")
	b.ReportMetric(ms(r.Session.P99), "ms-session-p99")
	b.ReportMetric(ms(r.Session.Max), "ms-session-max")
	b.ReportMetric(ms(r.Certified.P50), "ms-certified-p50")
	b.ReportMetric(float64(r.Status.Correct), "status-correct")
	b.ReportMetric(float64(r.Status.NoStatus), "status-missing")
	b.ReportMetric(float64(r.QueueFull), "queue-full-warnings")
	b.ReportMetric(r.CPU.Total().Seconds(), "cpu-s")
	b.ReportMetric(ms(r.CPUPerAgent), "ms-cpu-per-agent")
	b.ReportMetric(ms(r.AllCPUPerAgent), "ms-cpu-per-agent-with-agents")
	b.ReportMetric(r.Rate, "sessions/s")
	b.ReportMetric(r.Limit.PerSecond, "limit-agents/s")
	b.ReportMetric(r.RateOfLimit, "rate-of-limit")
	b.ReportMetric(ms(r.CPUToQuietPerAgent), "ms-cpu-per-agent-to-quiet")
	b.ReportMetric(r.APIRequestsToQuiet["PATCH kubernetesclusters/status"]/float64(r.Agents), "status-patches/cluster")
	// Reported first, then asserted: a failing run still leaves its numbers.
	require.Equal(b, r.Agents, r.Status.Correct, "every KubernetesCluster status right %s after the last session", r.Status.After)
	require.Empty(b, r.Leaks, "no token or private key in the server's logs")
	require.Positive(b, r.ToQuiet.Wall, "what the storm set off was written: %v", r.Errors)
	require.GreaterOrEqual(b, r.APIRequestsToQuiet["POST meshes"], float64(r.Agents), "every cluster's Mesh was mirrored by the storm's last write")
}

// BenchmarkFleetIssuance: Identity.Renew through the server over open
// sessions, `cfssl serve`, step-ca (no database and badger) and a bare
// x509.CreateCertificate signing the same requests at each of
// -fleet.concurrency for -fleet.duration.
func BenchmarkFleetIssuance(b *testing.B) {
	env := startEnv(b)
	var levels []int
	for _, s := range strings.Split(*concFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		require.NoError(b, err)
		levels = append(levels, n)
	}
	var r *fleet.IssuanceResult
	for b.Loop() {
		var err error
		r, err = fleet.Issuance(context.Background(), fleet.IssuanceConfig{Options: options(b, env), Concurrency: levels,
			Duration: *durationFlag, Backends: strings.Split(*backendsFlag, ",")})
		require.NoError(b, err)
	}
	report(b, r)
	for _, row := range r.Rows {
		require.Zero(b, row.Errors, "%s at %d: %s", row.Backend, row.Concurrency, row.FirstError)
		b.ReportMetric(row.PerSecond, fmt.Sprintf("certs/s-%s-c%d", row.Backend, row.Concurrency))
		b.ReportMetric(ms(row.CPUPerCert), fmt.Sprintf("ms-cpu/cert-%s-c%d", row.Backend, row.Concurrency))
	}
	require.Empty(b, r.Leaks)
	// After Renew at full speed, every status names the last certificate.
	require.Equal(b, r.StatusAfter.Total, r.StatusAfter.Correct, "statuses %s after the last Renew", r.StatusAfter.After)
}

// BenchmarkFleetIdle: the server's RSS, heap and goroutines per connected,
// idle agent (-fleet.idle-agents of them).
func BenchmarkFleetIdle(b *testing.B) {
	env := startEnv(b)
	var r *fleet.IdleResult
	for b.Loop() {
		var err error
		r, err = fleet.Idle(context.Background(), fleet.IdleConfig{Options: options(b, env), Agents: *idleFlag, Settle: *settleFlag})
		require.NoError(b, err)
	}
	report(b, r)
	require.Equal(b, r.Agents, r.Connected)
	b.ReportMetric(r.PerAgentRSS/1024, "KiB-rss/agent")
	b.ReportMetric(r.PerAgentLiveHeap/1024, "KiB-live-heap/agent")
	b.ReportMetric(r.PerAgentHeapInuse/1024, "KiB-heap-inuse/agent")
	b.ReportMetric(r.PerAgentStack/1024, "KiB-stack/agent")
	b.ReportMetric(r.PerAgentGoroutines, "goroutines/agent")
	require.Empty(b, r.Leaks, "no token or private key in the server's logs")
}

// BenchmarkFleetConfigPlane: -fleet.clusters clusters of one mesh, one
// Deployment and its Service; their discovered objects mirrored, a
// TrafficPolicy without selectors edited -fleet.edits times (edit → every
// agent has it), then deregistration until their objects are gone.
func BenchmarkFleetConfigPlane(b *testing.B) {
	env := startEnv(b)
	var r *fleet.ConfigPlaneResult
	for b.Loop() {
		var err error
		r, err = fleet.ConfigPlane(context.Background(), fleet.ConfigPlaneConfig{Options: options(b, env), Clusters: *clustersFlag, Edits: *editsFlag, Replicas: *configReplicas})
		require.NoError(b, err)
	}
	report(b, r)
	require.Equal(b, r.Clusters, r.Refused, "deregistration refused every agent")
	b.ReportMetric(ms(r.Reach.P50), "ms-edit-p50")
	b.ReportMetric(ms(r.Reach.P99), "ms-edit-p99")
	b.ReportMetric(float64(r.Edits[0].PolicyObjectsMax), "policy-objects/cluster")
	b.ReportMetric(r.MirroredAfterFirst.Seconds(), "s-mirrored")
	b.ReportMetric(r.Removed.Seconds(), "s-removed")
	require.Empty(b, r.Leaks, "no token or private key in the server's logs")
}

// BenchmarkFleetSnapshotLimit: the largest snapshot (Services of 10 pods)
// an agent can send, and the server's answer to one Service more.
func BenchmarkFleetSnapshotLimit(b *testing.B) {
	env := startEnv(b)
	var r *fleet.SnapshotLimitResult
	for b.Loop() {
		var err error
		r, err = fleet.SnapshotLimit(context.Background(), fleet.SnapshotLimitConfig{Options: options(b, env)})
		require.NoError(b, err)
	}
	report(b, r)
	for _, s := range r.Shapes {
		require.True(b, s.Accepted, "%s: %s", s.Shape, s.Error)
		b.ReportMetric(float64(s.Pods), "pods-"+s.Shape)
		b.ReportMetric(ms(s.AckAfter), "ms-ack-"+s.Shape)
	}
	require.NotEmpty(b, r.OverResult)
}

// BenchmarkFleetFailover: -fleet.failover-agents agents on 3 server
// replicas; the busiest replica is SIGKILLed, then the Lease holder (with a
// policy edit right after): kill → every agent that was on it holds its
// cluster's current output head from another replica, and the apiserver's
// writes in a -fleet.steady window and after each kill.
func BenchmarkFleetFailover(b *testing.B) {
	env := startEnv(b)
	var r *fleet.FailoverResult
	for b.Loop() {
		var err error
		r, err = fleet.Failover(context.Background(), fleet.FailoverConfig{Options: options(b, env), Agents: *failoverFlag, Steady: *steadyFlag})
		require.NoError(b, err)
	}
	report(b, r)
	b.ReportMetric(float64(r.Busiest.Moved), "moved-busiest")
	b.ReportMetric(ms(r.Busiest.Resynced.P50), "ms-busiest-resync-p50")
	b.ReportMetric(ms(r.Busiest.Resynced.P99), "ms-busiest-resync-p99")
	b.ReportMetric(ms(r.Busiest.AllResynced), "ms-busiest-resync-max")
	b.ReportMetric(float64(r.Leader.Moved), "moved-leader")
	b.ReportMetric(ms(r.Leader.AllResynced), "ms-leader-resync-max")
	b.ReportMetric(ms(r.Leader.LeaseMoved), "ms-lease-moved")
	b.ReportMetric(ms(r.Leader.EditAll), "ms-edit-all-acked")
	b.ReportMetric(r.Steady.PerSecond, "writes/s-steady")
	b.ReportMetric(r.EtcdEnd, "etcd-B")
	// Reported first, then asserted: a failing run still leaves its numbers.
	for _, p := range []fleet.FailoverPhase{r.Busiest, r.Leader} {
		require.Zero(b, p.NotResynced, "%s: agents that never resynced (%s)", p.Killed, p.Example)
		require.Equal(b, p.Status.Total, p.Status.Correct, "%s: KubernetesCluster status %+v", p.Killed, p.Status)
	}
	require.Zero(b, r.Leader.EditNotReached, "the edit made during the leader's failover reached every agent")
	require.Zero(b, r.Regressions, "no agent received a version older than one it acked")
	require.Empty(b, r.Leaks, "no token or private key in any replica's logs")
	for _, rep := range r.Replica {
		require.Empty(b, rep.AuditError, "audit chain of %s", rep.Name)
	}
}

// BenchmarkFleetLifetime: -fleet.lifetime-agents agents with the real
// credential manager on 3 replicas whose agent certificates live
// -fleet.lifetime-agent-ttl and issuing CA -fleet.lifetime-issuer-ttl,
// through two issuing-CA renewals and a relay root rotation with the Lease
// holder SIGKILLed in Switching. At 1,000 agents give the certificates a
// few minutes, e.g.
//
//	go test ./test/fleet -run '^$' -bench Lifetime -benchtime 1x -timeout 1h \
//	  -fleet.lifetime-agents 1000 -fleet.lifetime-agent-ttl 5m -fleet.lifetime-issuer-ttl 20m
func BenchmarkFleetLifetime(b *testing.B) {
	env := startEnv(b)
	var r *fleet.LifetimeResult
	for b.Loop() {
		var err error
		r, err = fleet.Lifetime(context.Background(), fleet.LifetimeConfig{Options: options(b, env), Agents: *lifetimeFlag,
			AgentCertTTL: *lifetimeTTLFlag, IssuerTTL: *lifetimeCAFlag, Timeout: time.Hour})
		if r != nil {
			report(b, r)
		}
		require.NoError(b, err)
	}
	b.ReportMetric(float64(r.Agents), "agents")
	b.ReportMetric(float64(r.Lost), "lost")
	b.ReportMetric(float64(r.RefusedRenews), "refused-renews")
	b.ReportMetric(float64(r.ThrottledRenews), "throttled-renews")
	b.ReportMetric(float64(r.ReBootstraps), "re-bootstraps")
	b.ReportMetric(float64(r.IssuerRenewals), "issuer-renewals")
	b.ReportMetric(float64(r.Renewals), "agent-renewals")
	b.ReportMetric(float64(r.KilledSessions), "sessions-on-killed")
	b.ReportMetric(ms(r.MaxGap), "ms-max-gap")
	b.ReportMetric(r.Wall.Seconds(), "s-wall")
	// Reported first, then asserted: a failing run still leaves its numbers.
	require.Zero(b, r.Lost, "agents lost: %v", r.LostExamples)
	require.Zero(b, r.RefusedRenews)
	require.Zero(b, r.ThrottledRenews, "%v", r.CredentialLog)
	require.Zero(b, r.ReBootstraps)
	require.True(b, r.RotationDone)
	require.Equal(b, r.Agents, r.PinnedNewRoot)
	require.GreaterOrEqual(b, r.IssuerRenewals, 2)
	require.Empty(b, r.Leaks)
}
