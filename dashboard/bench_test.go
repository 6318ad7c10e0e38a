package dashboard

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/relaymesh/relaymesh/translation/worldtest"
)

// largeWorld is the fleet the access audit is measured with
// (worldtest.Access) as the dashboard's source.
func largeWorld(tb testing.TB, clusters, services, policies int) *StaticSource {
	tb.Helper()
	return &StaticSource{In: worldtest.New(tb, worldtest.Access(clusters, services, policies)), Rev: "1"}
}

// BenchmarkAccessPageFirstRender is the Access page's first render for
// 10 clusters, 1,000 services and 1,000 AccessPolicies (issue 17: at most
// 2 s): a new Dashboard each time, so the audit behind the page is
// computed, not cached; then the table, the graph and the HTML, as a
// browser's GET of /access gets them.
func BenchmarkAccessPageFirstRender(b *testing.B) {
	src := largeWorld(b, 10, 1000, 1000)
	var bytes, rows int
	for b.Loop() {
		d, err := New(Config{Namespace: "relaymesh", Source: src, Auth: tokenAuth{users: map[string]string{"t": "viewer"},
			allow: map[string]map[string]bool{"viewer": {"*": true}}}, Clock: func() time.Time { return testNow }})
		if err != nil {
			b.Fatal(err)
		}
		req := httptest.NewRequest(http.MethodGet, "/access", nil)
		req.Header.Set("Authorization", "Bearer t")
		rec := httptest.NewRecorder()
		d.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `id="access-graph"`) {
			b.Fatalf("GET /access: %d %.300s", rec.Code, rec.Body.String())
		}
		bytes, rows = rec.Body.Len(), strings.Count(rec.Body.String(), "<tr")
	}
	b.ReportMetric(float64(bytes), "html-bytes")
	b.ReportMetric(float64(rows), "rows")
}

// BenchmarkAccessPageCached is the same page once the audit of the
// current input is cached (every later load until the input changes).
func BenchmarkAccessPageCached(b *testing.B) {
	d, err := New(Config{Namespace: "relaymesh", Source: largeWorld(b, 10, 1000, 1000), Auth: tokenAuth{users: map[string]string{"t": "viewer"},
		allow: map[string]map[string]bool{"viewer": {"*": true}}}, Clock: func() time.Time { return testNow }})
	if err != nil {
		b.Fatal(err)
	}
	get := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/access", nil)
		req.Header.Set("Authorization", "Bearer t")
		rec := httptest.NewRecorder()
		d.ServeHTTP(rec, req)
		return rec
	}
	if rec := get(); rec.Code != http.StatusOK {
		b.Fatalf("GET /access: %d", rec.Code)
	}
	for b.Loop() {
		if rec := get(); rec.Code != http.StatusOK {
			b.Fatalf("GET /access: %d", rec.Code)
		}
	}
}

// The Access graph of a large fleet stays drawable: more than
// maxGraphNodes identities on a side are grouped (by namespace, then by
// cluster) on both sides, and the table and the JSON still hold every
// pair.
func TestAccessGraphGroupsALargeFleet(t *testing.T) {
	d, err := New(Config{Namespace: "relaymesh", Source: largeWorld(t, 10, 1000, 1000), Auth: tokenAuth{users: map[string]string{"t": "viewer"},
		allow: map[string]map[string]bool{"viewer": {"*": true}}}, Clock: func() time.Time { return testNow }})
	if err != nil {
		t.Fatal(err)
	}
	p, err := d.accessPage(accessFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Total < 1000 || p.Matching != p.Total {
		t.Fatalf("the matrix has %d pairs, %d matching: want every one of at least 1,000", p.Total, p.Matching)
	}
	g := p.Graph
	if g.Grouping == "identity" || len(g.Left) > maxGraphNodes || len(g.Right) > maxGraphNodes {
		t.Fatalf("graph grouped by %s with %d sources and %d destinations: want both sides grouped to at most %d", g.Grouping, len(g.Left), len(g.Right), maxGraphNodes)
	}
	for _, n := range g.Right {
		if strings.Contains(n.ID, " @ ") {
			t.Errorf("destination node %q is a label, not a grouped ID", n.ID)
		}
	}
}
