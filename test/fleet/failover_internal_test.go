package fleet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestServerOrders(t *testing.T) {
	for _, tc := range []struct {
		addrs []string
		want  [][]string
	}{
		{[]string{"a"}, [][]string{{"a"}}},
		{[]string{"a", "b"}, [][]string{{"a", "b"}, {"a", "b"}, {"b", "a"}, {"b", "a"}}},
		{[]string{"a", "b", "c"}, [][]string{
			{"a", "b", "c"}, {"a", "c", "b"},
			{"b", "c", "a"}, {"b", "a", "c"},
			{"c", "a", "b"}, {"c", "b", "a"},
		}},
	} {
		got := serverOrders(tc.addrs)
		require.Equal(t, tc.want, got, "%v", tc.addrs)
	}
	// With 3 replicas, the agents of any one dead replica split evenly
	// between the two others, and every agent lists every replica.
	orders := serverOrders([]string{"a", "b", "c"})
	for _, dead := range []string{"a", "b", "c"} {
		next := map[string]int{}
		for _, o := range orders {
			require.ElementsMatch(t, []string{"a", "b", "c"}, o)
			if o[0] == dead {
				next[o[1]]++
			}
		}
		assert.Len(t, next, 2, "agents of %s move to both others", dead)
		for _, n := range next {
			assert.Equal(t, 1, n)
		}
	}
}

func TestWritesOf(t *testing.T) {
	w := writesOf(map[string]float64{
		"GET leases": 40, "LIST configmaps": 7, "WATCH secrets": 3,
		"PUT leases": 12, "PATCH kubernetesclusters/status": 30, "POST endpoints": 2, "DELETE secrets": 1,
	}, 10*time.Second)
	assert.Equal(t, 45.0, w.Total)
	assert.InDelta(t, 4.5, w.PerSecond, 1e-9)
	assert.Equal(t, map[string]float64{"PUT leases": 12, "PATCH kubernetesclusters/status": 30, "POST endpoints": 2, "DELETE secrets": 1}, w.ByRequest)
	assert.Zero(t, writesOf(nil, 0).PerSecond, "an empty window divides by nothing")
}
