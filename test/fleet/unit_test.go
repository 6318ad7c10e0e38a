package fleet_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/relay"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"github.com/relaymesh/relaymesh/relay/relaytest"
	"github.com/relaymesh/relaymesh/test/fleet"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

func TestSourceAddr(t *testing.T) {
	seen := map[string]int{}
	for i := range 100000 {
		a := fleet.SourceAddr(i)
		require.True(t, a.Is4() && a.IsLoopback(), "%v", a)
		b := a.As4()
		require.NotContains(t, []byte{0, 255}, b[3], "agent %d: %v", i, a)
		require.NotEqual(t, "127.0.0.1", a.String())
		if j, dup := seen[a.String()]; dup {
			t.Fatalf("agents %d and %d share %v", j, i, a)
		}
		seen[a.String()] = i
	}
	assert.Equal(t, "127.64.0.1", fleet.SourceAddr(0).String())
	assert.Equal(t, "127.64.1.1", fleet.SourceAddr(254).String())
}

// A storm's errors group by what went wrong, whichever agent's addresses
// they name.
func TestErrorKindDropsAddresses(t *testing.T) {
	for in, want := range map[string]string{
		`rpc error: code = Unavailable desc = connection error: desc = "error reading server preface: read tcp 127.64.0.126:58917->127.0.0.1:35763: use of closed network connection"`: `rpc error: code = Unavailable desc = connection error: desc = "error reading server preface: read tcp ADDR->ADDR: use of closed network connection"`,
		`x509: certificate is valid for 127.0.0.1, not 127.64.1.48`: `x509: certificate is valid for ADDR, not ADDR`,
		`dial tcp [::1]:9900: connect: connection refused`:          `dial tcp ADDR: connect: connection refused`,
		`dial tcp [fe80::1%eth0]:9900: i/o timeout`:                 `dial tcp ADDR: i/o timeout`,
		`bootstrap: code = DeadlineExceeded, 3 attempts in 1.5s`:    `bootstrap: code = DeadlineExceeded, 3 attempts in 1.5s`,
	} {
		assert.Equal(t, want, fleet.ErrorKind(errors.New(in)))
	}
	long := fleet.ErrorKind(errors.New(strings.Repeat("x", 500)))
	assert.Equal(t, strings.Repeat("x", 160)+"…", long)
}

func TestSummarize(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	s := fleet.Summarize(ds)
	assert.Equal(t, fleet.Summary{N: 100, Min: time.Millisecond, P50: 50 * time.Millisecond, P90: 90 * time.Millisecond,
		P99: 99 * time.Millisecond, Max: 100 * time.Millisecond, Mean: 50500 * time.Microsecond}, s)
	assert.Equal(t, 100*time.Millisecond, ds[0], "the input is not reordered")
	assert.Equal(t, fleet.Summary{}, fleet.Summarize(nil))
	one := fleet.Summarize([]time.Duration{time.Second})
	assert.Equal(t, time.Second, one.P99)
	assert.Equal(t, time.Second, one.P50)
}

func TestParseMetrics(t *testing.T) {
	m := fleet.ParseMetrics(`# HELP go_goroutines Number of goroutines.
# TYPE go_goroutines gauge
go_goroutines 209
relaymesh_ca_issued_certificates_total{operation="renew",result="success"} 42
relaymesh_ca_issued_certificates_total{operation="renew",result="failure"} 1
relaymesh_ca_issued_certificates_total{operation="bootstrap",result="success"} 7 1700000000000
weird{label="a b"} 3
broken line
nan_metric NaN
`)
	assert.Equal(t, 209.0, m.Sum("go_goroutines"))
	assert.Equal(t, 50.0, m.Sum("relaymesh_ca_issued_certificates_total"))
	assert.Equal(t, 43.0, m.Sum("relaymesh_ca_issued_certificates_total", `operation="renew"`))
	assert.Equal(t, 42.0, m.Sum("relaymesh_ca_issued_certificates_total", `operation="renew"`, `result="success"`))
	assert.Equal(t, 3.0, m.Sum("weird"))
	assert.Zero(t, m.Sum("broken"))
	assert.Zero(t, m.Sum("missing"))
	d := fleet.ParseMetrics("go_goroutines 250\nnew 1\n").Sub(m)
	assert.Equal(t, 41.0, d.Sum("go_goroutines"))
	assert.Equal(t, 1.0, d.Sum("new"))
}

func FuzzParseMetrics(f *testing.F) {
	f.Add("a 1\nb{x=\"y\"} 2 3\n# c\n")
	f.Add("{} }{ \n\x00 1e400\n")
	f.Fuzz(func(t *testing.T, text string) {
		m := fleet.ParseMetrics(text)
		for series := range m {
			_ = m.Sum(series)
		}
	})
}

func TestReadLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "server.log")
	require.NoError(t, os.WriteFile(path, []byte(`{"time":"2026-01-01T00:00:00Z","level":"INFO","msg":"agent certificate issued","cluster":"a"}
{"time":"2026-01-01T00:00:02Z","level":"WARN","msg":"status queue full; dropping update","cluster":"b"}
not json at all
I0101 00:00:02.500000   19980 request.go:752] "Waited before sending request" delay="10.827667886s" reason="client-side throttling, not priority and fairness" verb="GET" URL="https://127.0.0.1:1/api/v1/namespaces/relaymesh/secrets/x"
{"time":"2026-01-01T00:00:03Z","level":"INFO","msg":"agent certificate issued","cluster":"c"}
`), 0o600))
	all, err := fleet.ReadLog(path, time.Time{}, nil)
	require.NoError(t, err)
	require.Len(t, all, 5)
	assert.Equal(t, "a", all[0].Attrs["cluster"])
	assert.Equal(t, "not json at all", all[2].Msg)
	assert.Equal(t, map[string]int{"INFO agent certificate issued": 2, "WARN status queue full; dropping update": 1, "not json at all": 1,
		"klog-INFO Waited before sending request": 1}, fleet.LogCounts(all))
	assert.Equal(t, fleet.Throttled{Lines: 1, MaxDelay: 10827667886, ByVerb: map[string]int{"GET": 1}}, fleet.ThrottledOf(all))
	later, err := fleet.ReadLog(path, time.Date(2026, 1, 1, 0, 0, 1, 0, time.UTC), func(l fleet.LogLine) bool { return l.Level == "INFO" })
	require.NoError(t, err)
	require.Len(t, later, 1)
	assert.Equal(t, "c", later[0].Attrs["cluster"])
	_, err = fleet.ReadLog(filepath.Join(t.TempDir(), "missing"), time.Time{}, nil)
	assert.Error(t, err)
}

func TestReadProc(t *testing.T) {
	u, err := fleet.ReadProc(0)
	require.NoError(t, err)
	assert.Positive(t, u.RSS)
	assert.Positive(t, u.Threads)
	assert.Positive(t, u.FDLimit)
	m, err := fleet.StartCPU(map[string]int{"self": 0})
	require.NoError(t, err)
	for x, deadline := 0, time.Now().Add(100*time.Millisecond); time.Now().Before(deadline); x++ {
		_ = x * x
	}
	w, err := m.Stop()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, w.Wall, 100*time.Millisecond)
	assert.GreaterOrEqual(t, w.Total(), time.Duration(0))
	_, err = fleet.ReadProc(-1)
	assert.Error(t, err)
}

func TestRaiseFileLimit(t *testing.T) {
	before, err := fleet.ReadProc(0)
	require.NoError(t, err)
	got, err := fleet.RaiseFileLimit(uint64(before.FDLimit))
	require.NoError(t, err)
	assert.GreaterOrEqual(t, got, uint64(before.FDLimit))
}

// Generated snapshots pass the server's own validation, with the hash
// snapshothash.Of gives.
func TestSnapshotsAreValid(t *testing.T) {
	for name, s := range map[string]interface {
		Snapshot(string) *relaypb.Snapshot
	}{
		"default":         fleet.SnapshotSpec{},
		"services":        fleet.SnapshotSpec{Services: 30, PodsPerService: 4, ServicesPerNamespace: 7},
		"discovery-bench": relaytest.Rich{Namespaces: 2},
	} {
		t.Run(name, func(t *testing.T) {
			snap := s.Snapshot("cluster-7")
			require.NoError(t, relay.ValidateSnapshot("cluster-7", snap, relay.SnapshotLimits{}))
			require.Len(t, snap.GetMeshes(), 1)
			assert.Equal(t, "cluster-7.local", snap.GetMeshes()[0].GetTrustDomain())
			assert.Error(t, relay.ValidateSnapshot("cluster-8", snap, relay.SnapshotLimits{}), "another cluster's snapshot is refused")
			assert.True(t, proto.Equal(snap, s.Snapshot("cluster-7")), "deterministic")
		})
	}
	snap := fleet.SnapshotSpec{Services: 30, PodsPerService: 4, ServicesPerNamespace: 7}.Snapshot("c")
	assert.Len(t, snap.GetDestinations(), 30)
	assert.Len(t, snap.GetWorkloads(), 30)
	for _, d := range snap.GetDestinations() {
		assert.Len(t, d.GetEndpoints(), 4)
	}
	rich := relaytest.Rich{Namespaces: 2}.Snapshot("c")
	assert.Len(t, rich.GetDestinations(), 40)
	assert.Len(t, rich.GetWorkloads(), 40)
	assert.Equal(t, 400, relaytest.Rich{Namespaces: 2}.Pods())
}

// FindSecretsIn finds a token's secret wherever it sits in a line (alone,
// inside a whole token, next to other base64url characters) and names only
// the cluster; unrelated base64url runs are not reported.
func TestFindSecretsIn(t *testing.T) {
	secret := strings.Repeat("Ab1_-", 8) + "xyz" // 43 characters
	other := strings.Repeat("Zz9", 14) + "q"
	members := []fleet.Member{{Cluster: "c1", Token: "0123456789abcdef." + secret}, {Cluster: "c2", Token: "fedcba9876543210." + other}}
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		return p
	}
	clean := write("clean.log", `{"msg":"agent session opened","hash":"`+strings.Repeat("ab", 32)+`"}`+"\n")
	found, err := fleet.FindSecretsIn([]string{clean}, members)
	require.NoError(t, err)
	assert.Empty(t, found)
	for _, line := range []string{secret, "token=0123456789abcdef." + secret, `{"x":"QQ` + secret + `QQ"}`} {
		leaky := write("leaky.log", line+"\n")
		found, err := fleet.FindSecretsIn([]string{leaky}, members)
		require.NoError(t, err)
		require.Len(t, found, 1, line)
		assert.Contains(t, found[0], "the token of c1")
		assert.NotContains(t, found[0], secret)
	}
	key := write("key.log", "-----BEGIN EC PRIVATE KEY-----\n")
	found, err = fleet.FindSecretsIn([]string{key}, members)
	require.NoError(t, err)
	assert.Equal(t, []string{"a PEM private key in " + key}, found)
}

// The handshake limit does every agent's work and checks it: 40 agents,
// each with a certificate for its own key and a mutual handshake the server
// accepted, at a rate and CPU cost that are measured, not zero; no limit
// without agents, nor from a cancelled run.
func TestTheHandshakeLimitIsMeasuredOnEveryAgent(t *testing.T) {
	l, err := fleet.MeasureHandshakeLimit(context.Background(), 40, 4)
	require.NoError(t, err)
	assert.Equal(t, 40, l.Agents)
	assert.Equal(t, 4, l.Concurrency)
	assert.Positive(t, l.PerSecond)
	assert.Positive(t, l.CPUPerAgent)

	_, err = fleet.MeasureHandshakeLimit(context.Background(), 0, 4)
	assert.Error(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = fleet.MeasureHandshakeLimit(ctx, 40, 4)
	assert.Error(t, err, "a cancelled measurement reports no limit")
}
