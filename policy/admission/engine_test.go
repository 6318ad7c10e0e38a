package admission_test

import (
	"context"
	"maps"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/policy/admission"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDefaultRules(t *testing.T) {
	e, rec := newEngine(t, nil)
	production := map[string]string{"relaymesh.io/environment": "production"}
	restricted := []any{map[string]any{"kubeIdentityMatcher": map[string]any{"namespaces": []any{"team-a"}}}}
	fault := map[string]any{"faultInjection": map[string]any{"abort": map[string]any{"httpStatus": int64(503)}, "percentage": 10.0}}
	rootCA := func(generated map[string]any) map[string]any {
		return map[string]any{"meshes": []any{map[string]any{"name": "m"}},
			"mtls": map[string]any{"shared": map[string]any{"rootCA": map[string]any{"generated": generated}}}}
	}
	tests := []struct {
		name   string
		req    admission.Request
		rule   string // "" means allowed
		reason string // part of the message
	}{
		{name: "access: allow-all without annotation", req: request("AccessPolicy", map[string]any{}),
			rule: "relaymesh.admission.access_allow_all", reason: "lets every source reach every destination"},
		{name: "access: open matchers", req: request("AccessPolicy", map[string]any{
			"sourceSelector":      []any{map[string]any{"kubeIdentityMatcher": map[string]any{}}},
			"destinationSelector": []any{map[string]any{"kubeServiceMatcher": map[string]any{"labels": map[string]any{}}}},
		}), rule: "relaymesh.admission.access_allow_all", reason: "relaymesh.io/allow-all"},
		{name: "access: allow-all with annotation", req: func() admission.Request {
			r := request("AccessPolicy", map[string]any{})
			r.Object["metadata"].(map[string]any)["annotations"] = map[string]any{"relaymesh.io/allow-all": "true"}
			return r
		}()},
		{name: "access: restricted sources", req: request("AccessPolicy", map[string]any{"sourceSelector": restricted})},
		{name: "traffic: fault injection in production", req: func() admission.Request {
			r := request("TrafficPolicy", map[string]any{"policy": fault})
			r.NamespaceLabels = production
			return r
		}(), rule: "relaymesh.admission.production_fault_injection", reason: "injects faults"},
		{name: "traffic: fault injection elsewhere", req: request("TrafficPolicy", map[string]any{"policy": fault})},
		{name: "traffic: no fault injection in production", req: func() admission.Request {
			r := request("TrafficPolicy", map[string]any{"policy": map[string]any{"requestTimeout": "1s"}})
			r.NamespaceLabels = production
			return r
		}()},
		{name: "virtual mesh: RSA2048 root", req: request("VirtualMesh", rootCA(map[string]any{"keyAlgorithm": "RSA2048"})),
			rule: "relaymesh.admission.root_key_strength", reason: "RSA2048"},
		{name: "virtual mesh: RSA3072 root", req: request("VirtualMesh", rootCA(map[string]any{"keyAlgorithm": "RSA3072"}))},
		{name: "virtual mesh: default root key", req: request("VirtualMesh", rootCA(map[string]any{}))},
		{name: "virtual destination: nothing to check", req: request("VirtualDestination", map[string]any{"hostname": "a.global"})},
		{name: "delete of an allow-all policy", req: func() admission.Request {
			r := request("AccessPolicy", map[string]any{})
			r.Operation, r.OldObject, r.Object = admission.OperationDelete, r.Object, nil
			return r
		}()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := e.Decide(context.Background(), tc.req)
			require.NoError(t, err)
			assert.Equal(t, e.Version(), d.Version)
			ev := rec.last(t)
			assert.Equal(t, audit.AdmissionDecision, ev.Type)
			assert.Equal(t, "alice", ev.Subject)
			assert.Equal(t, tc.req.Kind, ev.Details["kind"])
			assert.Equal(t, tc.req.Operation, ev.Details["operation"])
			assert.Equal(t, "team-a", ev.Details["namespace"])
			assert.Equal(t, "obj", ev.Details["name"])
			assert.Equal(t, d.Version, ev.Details["ruleset"])
			if tc.rule == "" {
				assert.True(t, d.Allowed, "denials: %+v", d.Denials)
				assert.Empty(t, d.Denials)
				assert.Equal(t, audit.ResultSuccess, ev.Result)
				return
			}
			assert.False(t, d.Allowed)
			require.Len(t, d.Denials, 1)
			assert.Equal(t, tc.rule, d.Denials[0].Rule)
			assert.Contains(t, d.Denials[0].Message, tc.reason)
			assert.Contains(t, d.Message(), tc.rule)
			assert.Equal(t, audit.ResultFailure, ev.Result)
			assert.Equal(t, tc.rule, ev.Details["rules"])
		})
	}
}

// TestDecideFailsClosed: whatever goes wrong, the object is refused, the
// error wraps ErrCheckFailed, and the refusal is audited.
func TestDecideFailsClosed(t *testing.T) {
	e, rec := newEngine(t, nil)
	nested := map[string]any{}
	deep := nested
	for range admission.MaxDepth + 5 {
		next := map[string]any{}
		deep["x"] = next
		deep = next
	}
	tests := []struct {
		name string
		edit func(*admission.Request)
		want string
	}{
		{"unknown operation", func(r *admission.Request) { r.Operation = "CONNECT" }, "operation"},
		{"no operation", func(r *admission.Request) { r.Operation = "" }, "operation"},
		{"no kind", func(r *admission.Request) { r.Kind = "" }, "no kind"},
		{"create without object", func(r *admission.Request) { r.Object = nil }, "without an object"},
		{"NaN", func(r *admission.Request) { r.Object["spec"] = map[string]any{"x": math.NaN()} }, "NaN"},
		{"infinity", func(r *admission.Request) { r.Object["spec"] = map[string]any{"x": math.Inf(-1)} }, "infinite"},
		{"not JSON", func(r *admission.Request) { r.Object["spec"] = map[string]any{"x": make(chan int)} }, "not JSON"},
		{"old object not JSON", func(r *admission.Request) {
			r.Operation, r.OldObject = admission.OperationUpdate, map[string]any{"f": func() {}}
		}, "oldObject"},
		{"too deep", func(r *admission.Request) { r.Object["spec"] = nested }, "nested deeper"},
		{"too large", func(r *admission.Request) {
			r.Object["spec"] = map[string]any{"a": strings.Repeat("x", 9<<20), "b": strings.Repeat("y", 9<<20)}
		}, "bytes of strings"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := request("VirtualDestination", map[string]any{})
			tc.edit(&req)
			d, err := e.Decide(context.Background(), req)
			require.ErrorIs(t, err, admission.ErrCheckFailed)
			assert.ErrorContains(t, err, tc.want)
			assert.False(t, d.Allowed)
			require.Len(t, d.Denials, 1)
			assert.Equal(t, admission.EngineRule, d.Denials[0].Rule)
			assert.Contains(t, d.Denials[0].Message, "admission check failed")
			ev := rec.last(t)
			assert.Equal(t, audit.ResultFailure, ev.Result)
			assert.Equal(t, "admission check failed", ev.Reason)
			assert.NotEmpty(t, ev.Details["error"])
		})
	}

	t.Run("audit failure turns an allow into a denial", func(t *testing.T) {
		e, rec := newEngine(t, nil)
		rec.setFail(errDiskFull)
		d, err := e.Decide(context.Background(), request("VirtualDestination", map[string]any{}))
		require.ErrorIs(t, err, admission.ErrCheckFailed)
		require.ErrorIs(t, err, errDiskFull)
		assert.False(t, d.Allowed)
		assert.Contains(t, d.Message(), "audit log")
	})
}

// TestAuditEventLimits: user-controlled fields are cleaned and cut so the
// audit log accepts the event; a real log stays verifiable.
func TestAuditEventLimits(t *testing.T) {
	path := t.TempDir() + "/audit.log"
	log, err := audit.Open(audit.Config{Path: path})
	require.NoError(t, err)
	e, err := admission.New(admission.Config{Recorder: log})
	require.NoError(t, err)
	req := request("AccessPolicy", map[string]any{})
	req.User.Username = "mallory\n{\"forged\":true}\u2028" + strings.Repeat("é", 2000)
	req.Name = strings.Repeat("n", 5000)
	req.Namespace = "ns\x1b[31m"
	d, err := e.Decide(context.Background(), req)
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	assert.LessOrEqual(t, len(d.Denials[0].Message), 1024, "messages are cut at 1 KiB")
	require.NoError(t, log.Close())

	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	sum, err := audit.Verify(f)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), sum.Records)
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	e, _ := newEngine(t, func(c *admission.Config) { c.Registerer = reg })
	ctx := context.Background()
	_, err := e.Decide(ctx, request("AccessPolicy", map[string]any{}))
	require.NoError(t, err)
	_, err = e.Decide(ctx, request("VirtualDestination", map[string]any{}))
	require.NoError(t, err)
	_, err = e.Decide(ctx, request("Secret", map[string]any{}))
	require.NoError(t, err)
	_, err = e.Decide(ctx, admission.Request{Operation: "PATCH", Kind: "AccessPolicy"})
	require.Error(t, err)
	e.Load(ctx, []admission.RuleSet{single("ns/broken", "package relaymesh.admission.x\ndeny contains")})

	decisions := func(kind, result string) float64 {
		return metricValue(t, reg, admission.MetricDecisions, map[string]string{"kind": kind, "result": result})
	}
	assert.Equal(t, 1.0, decisions("AccessPolicy", "denied"))
	assert.Equal(t, 1.0, decisions("AccessPolicy", "error"))
	assert.Equal(t, 1.0, decisions("VirtualDestination", "allowed"))
	assert.Equal(t, 1.0, decisions("other", "allowed"), "unknown kinds are not labels")
	assert.Equal(t, 4.0, metricValue(t, reg, admission.MetricDecisionSeconds, nil))
	assert.Equal(t, 1.0, metricValue(t, reg, admission.MetricRuleSets, map[string]string{"state": "accepted"}))
	assert.Equal(t, 1.0, metricValue(t, reg, admission.MetricRuleSets, map[string]string{"state": "refused"}))
	assert.Equal(t, 1.0, metricValue(t, reg, admission.MetricReloadFailures, nil))

	_, err = admission.New(admission.Config{Recorder: audit.Discard, Registerer: reg})
	assert.Error(t, err, "a second engine on the same registry is refused")
}

// metricValue is the value of the series of name with exactly labels: a
// counter's or gauge's value, a histogram's sample count.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if len(got) != len(labels) || !maps.Equal(got, labels) && len(labels) > 0 {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	require.Failf(t, "no series", "%s%v", name, labels)
	return 0
}

func TestConfigValidate(t *testing.T) {
	err := admission.Config{Timeout: -1, TestTimeout: 2 * 3600e9, MaxRuleSets: -1, MaxRuleSetBytes: -1}.Validate()
	require.Error(t, err)
	for _, field := range []string{"recorder", "timeout", "testTimeout", "maxRuleSets", "maxRuleSetBytes"} {
		assert.ErrorContains(t, err, field+":")
	}
	_, err = admission.New(admission.Config{})
	assert.ErrorContains(t, err, "recorder: required")
	assert.NoError(t, admission.Config{Recorder: audit.Discard}.Validate())
}
