package logging

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"
)

// keysOf decodes one JSON line into its keys in order, with repeats (a map
// would hide a duplicate key).
func keysOf(t *testing.T, line string) []string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(line))
	tok, err := dec.Token()
	require.NoError(t, err)
	require.Equal(t, json.Delim('{'), tok)
	var keys []string
	for dec.More() {
		k, err := dec.Token()
		require.NoError(t, err)
		keys = append(keys, k.(string))
		var skip json.RawMessage
		require.NoError(t, dec.Decode(&skip))
	}
	return keys
}

func lines(b *bytes.Buffer) []string {
	var out []string
	sc := bufio.NewScanner(b)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

func TestEveryKeyAppearsOncePerLine(t *testing.T) {
	var b bytes.Buffer
	log := New(&b, slog.LevelDebug)
	server := log.With("component", "server")
	status := server.With("component", "cluster-status", "cluster", "c1")
	status.Info("patched", "cluster", "c2", "component", "inner", "n", 1)
	server.With("a", 1).WithGroup("g").With("a", 2).Info("grouped", "a", 3, "b", 4)
	log.Info("repeat in one call", "k", 1, "k", 2)

	out := lines(&b)
	require.Len(t, out, 3)
	for _, l := range out {
		assertUniqueKeys(t, l)
	}
	var rec map[string]any
	require.NoError(t, json.Unmarshal([]byte(out[0]), &rec))
	assert.Equal(t, "inner", rec["component"], "the innermost value wins")
	assert.Equal(t, "c2", rec["cluster"])
	assert.Equal(t, []string{"time", "level", "msg", "component", "cluster", "n"}, keysOf(t, out[0]), "a replaced key keeps its place")

	require.NoError(t, json.Unmarshal([]byte(out[1]), &rec))
	assert.Equal(t, float64(1), rec["a"], "outside the group")
	assert.Equal(t, map[string]any{"a": float64(3), "b": float64(4)}, rec["g"], "inside the group, unique on its own")

	require.NoError(t, json.Unmarshal([]byte(out[2]), &rec))
	assert.Equal(t, float64(2), rec["k"])
}

func TestDurationsAreStrings(t *testing.T) {
	var b bytes.Buffer
	log := New(&b, slog.LevelInfo).With("period", 5*time.Second)
	log.Info("tick", "took", 1500*time.Millisecond, slog.Group("g", "d", time.Minute))
	var rec map[string]any
	require.NoError(t, json.Unmarshal(b.Bytes(), &rec))
	assert.Equal(t, "5s", rec["period"])
	assert.Equal(t, "1.5s", rec["took"])
	assert.Equal(t, map[string]any{"d": "1m0s"}, rec["g"])
}

func TestLevelIsHonoured(t *testing.T) {
	var b bytes.Buffer
	log := New(&b, slog.LevelWarn).With("component", "x")
	log.Info("dropped")
	log.Warn("kept")
	assert.Len(t, lines(&b), 1)
}

func TestParseLevel(t *testing.T) {
	for in, want := range map[string]slog.Level{"debug": slog.LevelDebug, "INFO": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError} {
		got, err := ParseLevel(in)
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
	for _, bad := range []string{"", "verbose", "info;rm", strings.Repeat("x", 1<<16)} {
		_, err := ParseLevel(bad)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "want debug, info, warn or error")
	}
}

// klog's lines (client-go's throttling, leader election) come out as JSON
// records of the same handler, with component klog and string durations.
func TestKlogGoesThroughTheHandler(t *testing.T) {
	var before, b bytes.Buffer
	InstallKlog(&before)
	defer klog.ClearLogger()
	klog.InfoS("before any process logger", "n", 1)
	klog.Flush()
	assert.Contains(t, before.String(), `msg="before any process logger" n=1`, "until a process names its logger: text on the fallback")
	RouteKlog(New(&b, slog.LevelInfo).With("component", "server"))
	defer klogTarget.Store(nil)
	klog.InfoS("Waited before sending request", "delay", 10800*time.Millisecond, "verb", "GET")
	klog.ErrorS(errors.New("boom"), "watch failed")
	klog.Flush()
	out := lines(&b)
	require.Len(t, out, 2, b.String())
	var rec map[string]any
	require.NoError(t, json.Unmarshal([]byte(out[0]), &rec), out[0])
	assert.Equal(t, "Waited before sending request", rec["msg"])
	assert.Equal(t, "INFO", rec["level"])
	assert.Equal(t, KlogComponent, rec["component"])
	assert.Equal(t, "10.8s", rec["delay"])
	require.NoError(t, json.Unmarshal([]byte(out[1]), &rec), out[1])
	assert.Equal(t, "ERROR", rec["level"])
	for _, l := range out {
		assertUniqueKeys(t, l)
	}
}

func assertUniqueKeys(t *testing.T, line string) {
	t.Helper()
	seen := map[string]bool{}
	for _, k := range keysOf(t, line) {
		assert.False(t, seen[k], "key %q twice in %s", k, line)
		seen[k] = true
	}
}
