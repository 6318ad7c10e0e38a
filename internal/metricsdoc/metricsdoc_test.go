package metricsdoc_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relaymesh/relaymesh/internal/metricsdoc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDocsListEveryMetricTheCodeCreates: docs/metrics.md lists every
// metric the module's code creates, with its type and label names, and
// nothing else.
func TestDocsListEveryMetricTheCodeCreates(t *testing.T) {
	root := filepath.Join("..", "..")
	defined, err := metricsdoc.Defined(root)
	require.NoError(t, err)
	// The scan reads the whole module: the server's, the trust controller's,
	// the admission engine's, the dashboard's and the agent's metrics.
	names := map[string]bool{}
	for _, m := range defined {
		names[m.Name] = true
	}
	require.Greater(t, len(names), 30)
	for _, n := range []string{"relaymesh_ca_issued_certificates_total", "relaymesh_trust_rotation_phase", "relaymesh_admission_decisions_total",
		"relaymesh_dashboard_sessions", "relaymesh_agent_relay_connected", "relaymesh_snapshot_store_subscribed", "relaymesh_server_leader"} {
		require.True(t, names[n], "%s is found", n)
	}

	f, err := os.Open(filepath.Join(root, "docs", "metrics.md"))
	require.NoError(t, err)
	defer f.Close()
	documented, err := metricsdoc.Documented(f)
	require.NoError(t, err)
	for _, p := range metricsdoc.Compare(defined, documented) {
		t.Error(p)
	}
}

// TestCompareFindsDrift: an undocumented metric, a documented one nothing
// creates, a wrong type, wrong labels and two definitions that disagree
// are each reported; agreeing duplicates (one metric in two tables) are
// not.
func TestCompareFindsDrift(t *testing.T) {
	defined := []metricsdoc.Metric{
		{Name: "a_total", Type: "counter", Labels: []string{"reason"}, Where: "a.go:1"},
		{Name: "b", Type: "gauge", Where: "b.go:1"},
		{Name: "b", Type: "gauge", Where: "b2.go:1"},
	}
	documented := []metricsdoc.Metric{
		{Name: "a_total", Type: "counter", Labels: []string{"reason"}, Where: "line 1"},
		{Name: "b", Type: "gauge", Where: "line 2"},
		{Name: "b", Type: "gauge", Where: "line 9"},
	}
	require.Empty(t, metricsdoc.Compare(defined, documented))

	tests := []struct {
		name    string
		change  func(def, doc []metricsdoc.Metric) ([]metricsdoc.Metric, []metricsdoc.Metric)
		problem string
	}{
		{"a metric not documented", func(def, doc []metricsdoc.Metric) ([]metricsdoc.Metric, []metricsdoc.Metric) {
			return append(def, metricsdoc.Metric{Name: "c_seconds", Type: "histogram", Where: "c.go:7"}), doc
		}, "c_seconds (c.go:7) is not in docs/metrics.md"},
		{"a documented metric nothing creates", func(def, doc []metricsdoc.Metric) ([]metricsdoc.Metric, []metricsdoc.Metric) {
			return def, append(doc, metricsdoc.Metric{Name: "gone_total", Type: "counter", Where: "line 30"})
		}, "gone_total (docs/metrics.md line 30) is created nowhere in the code"},
		{"a wrong type", func(def, doc []metricsdoc.Metric) ([]metricsdoc.Metric, []metricsdoc.Metric) {
			doc[0].Type = "gauge"
			return def, doc
		}, "a_total: docs/metrics.md line 1 says gauge, the code (a.go:1) makes a counter"},
		{"a missing label", func(def, doc []metricsdoc.Metric) ([]metricsdoc.Metric, []metricsdoc.Metric) {
			def[0].Labels = []string{"cluster", "reason"}
			return def, doc
		}, "a_total: docs/metrics.md line 1 lists labels [reason], the code (a.go:1) has [cluster reason]"},
		{"a second table disagrees", func(def, doc []metricsdoc.Metric) ([]metricsdoc.Metric, []metricsdoc.Metric) {
			doc[2].Labels = []string{"cluster"}
			return def, doc
		}, "b: docs/metrics.md line 9 lists labels [cluster], the code (b.go:1) has []"},
		{"two definitions disagree", func(def, doc []metricsdoc.Metric) ([]metricsdoc.Metric, []metricsdoc.Metric) {
			def[2].Type = "counter"
			return def, doc
		}, "b is defined twice, differently: b.go:1 and b2.go:1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clone := func(ms []metricsdoc.Metric) []metricsdoc.Metric {
				out := make([]metricsdoc.Metric, len(ms))
				copy(out, ms)
				return out
			}
			def, doc := tt.change(clone(defined), clone(documented))
			assert.Contains(t, metricsdoc.Compare(def, doc), tt.problem)
		})
	}
}

// writeModule writes files into a new module example.com/m.
func writeModule(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	files["go.mod"] = "module example.com/m\n\ngo 1.26\n"
	for name, content := range files {
		p := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
	return dir
}

// TestDefinedReadsAModule: names from literals, constants of the package
// and of another package, concatenations and Namespace/Subsystem; types
// from the constructor; label names of vectors. Test files, test/,
// testdata/ and nested modules are not read.
func TestDefinedReadsAModule(t *testing.T) {
	dir := writeModule(t, map[string]string{
		"names/names.go": "package names\n\nconst (\n\tPrefix = \"relaymesh_\"\n\tRequests = Prefix + \"requests_total\"\n\tLabel = \"code\"\n)\n",
		"srv/metrics.go": `package srv

import (
	prom "github.com/prometheus/client_golang/prometheus"
	"example.com/m/names"
)

const gaugeName = "relaymesh_up"

func metrics() []prom.Collector {
	return []prom.Collector{
		prom.NewCounterVec(prom.CounterOpts{Name: names.Requests, Help: "x"}, []string{names.Label, "method"}),
		prom.NewGauge(prom.GaugeOpts{Name: gaugeName}),
		prom.NewHistogram(prom.HistogramOpts{Namespace: "relaymesh", Subsystem: "io", Name: "seconds"}),
		prom.NewGaugeFunc(prom.GaugeOpts{Name: "relaymesh_func"}, func() float64 { return 1 }),
		prom.NewSummaryVec(prom.SummaryOpts{Name: "relaymesh_sizes"}, []string{"kind"}),
		prom.NewGaugeFunc(prom.GaugeOpts{Name: "relaymesh_phase", ConstLabels: prom.Labels{names.Label: "a"}}, func() float64 { return 1 }),
	}
}
`,
		"srv/metrics_test.go": "package srv\n\nimport \"github.com/prometheus/client_golang/prometheus\"\n\nvar _ = prometheus.NewGauge(prometheus.GaugeOpts{Name: \"test_only\"})\n",
		"test/harness.go":     "package harness\n\nimport \"github.com/prometheus/client_golang/prometheus\"\n\nvar _ = prometheus.NewGauge(prometheus.GaugeOpts{Name: \"harness_only\"})\n",
		"tools/go.mod":        "module example.com/tools\n",
		"tools/t.go":          "package tools\n\nimport \"github.com/prometheus/client_golang/prometheus\"\n\nvar _ = prometheus.NewGauge(prometheus.GaugeOpts{Name: \"other_module\"})\n",
		"srv/testdata/x.go":   "package x\n\nimport \"github.com/prometheus/client_golang/prometheus\"\n\nvar _ = prometheus.NewGauge(prometheus.GaugeOpts{Name: \"testdata_only\"})\n",
		"other/noprom.go":     "package other\n\nfunc NewGauge(o struct{ Name string }) {}\n",
	})
	got, err := metricsdoc.Defined(dir)
	require.NoError(t, err)
	assert.Equal(t, []metricsdoc.Metric{
		{Name: "relaymesh_requests_total", Type: "counter", Labels: []string{"code", "method"}, Where: "srv/metrics.go:12"},
		{Name: "relaymesh_up", Type: "gauge", Where: "srv/metrics.go:13"},
		{Name: "relaymesh_io_seconds", Type: "histogram", Where: "srv/metrics.go:14"},
		{Name: "relaymesh_func", Type: "gauge", Where: "srv/metrics.go:15"},
		{Name: "relaymesh_sizes", Type: "summary", Labels: []string{"kind"}, Where: "srv/metrics.go:16"},
		{Name: "relaymesh_phase", Type: "gauge", Labels: []string{"code"}, Where: "srv/metrics.go:17"},
	}, got)
}

// TestDefinedFailsClosed: a metric it cannot read is an error naming the
// place, never a metric silently left out.
func TestDefinedFailsClosed(t *testing.T) {
	tests := map[string]string{
		"a name from a variable":         "var name = \"x\"\n\nvar _ = prometheus.NewGauge(prometheus.GaugeOpts{Name: name})\n",
		"a name from a function":         "func name() string { return \"x\" }\n\nvar _ = prometheus.NewGauge(prometheus.GaugeOpts{Name: name()})\n",
		"opts kept in a variable":        "var opts = prometheus.GaugeOpts{Name: \"x\"}\n\nvar _ = prometheus.NewGauge(opts)\n",
		"a Desc built by hand":           "var _ = prometheus.NewDesc(\"x\", \"help\", nil, nil)\n",
		"labels from a variable":         "var labels = []string{\"a\"}\n\nvar _ = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: \"x\"}, labels)\n",
		"a constant of another module":   "var _ = prometheus.NewGauge(prometheus.GaugeOpts{Name: prometheus.DefRegistererName})\n",
		"no name":                        "var _ = prometheus.NewGauge(prometheus.GaugeOpts{Help: \"x\"})\n",
		"a name that is not a string":    "var _ = prometheus.NewGauge(prometheus.GaugeOpts{Name: 7})\n",
		"a name made by a function call": "var _ = prometheus.NewGauge(prometheus.GaugeOpts{Name: prometheus.BuildFQName(\"a\", \"b\", \"c\")})\n",
		"const labels from a variable":   "var l = prometheus.Labels{\"a\": \"b\"}\n\nvar _ = prometheus.NewGauge(prometheus.GaugeOpts{Name: \"x\", ConstLabels: l})\n",
	}
	for name, body := range tests {
		t.Run(name, func(t *testing.T) {
			dir := writeModule(t, map[string]string{"p/p.go": "package p\n\nimport \"github.com/prometheus/client_golang/prometheus\"\n\n" + body})
			_, err := metricsdoc.Defined(dir)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "p/p.go:")
		})
	}
}

// TestDocumented: rows whose first cell is a metric name, with type and
// the label names outside parentheses; other rows and text are skipped.
func TestDocumented(t *testing.T) {
	md := strings.Join([]string{
		"# Metrics",
		"| name | type | labels | meaning |",
		"| --- | --- | --- | --- |",
		"| `a_total` | counter | `operation` (`bootstrap`, `renew`), `result` (`success`, `failure` (not `x`)) | a |",
		"| `b` | gauge | — | b |",
		"text with `c_total` in it",
		"| `not a metric` | gauge | — | x |",
		"| `d` | histogram | `cluster` | d (`with` `ticks`) |",
	}, "\n")
	got, err := metricsdoc.Documented(strings.NewReader(md))
	require.NoError(t, err)
	assert.Equal(t, []metricsdoc.Metric{
		{Name: "a_total", Type: "counter", Labels: []string{"operation", "result"}, Where: "line 4"},
		{Name: "b", Type: "gauge", Where: "line 5"},
		{Name: "d", Type: "histogram", Labels: []string{"cluster"}, Where: "line 8"},
	}, got)
}
