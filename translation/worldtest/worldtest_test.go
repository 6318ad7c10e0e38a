package worldtest_test

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/all"
	"github.com/relaymesh/relaymesh/translation/worldtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Both fleets hold what their Spec says, and translate with every policy
// and the VirtualMesh Accepted, without an error or a warning: a benchmark
// on them measures translation, not the handling of a broken input.
func TestWorldsHoldWhatTheirSpecSaysAndTranslateCleanly(t *testing.T) {
	for name, s := range map[string]worldtest.Spec{
		"translation":            worldtest.Translation(5, 40, 40, false),
		"translation+federation": worldtest.Translation(5, 40, 40, true),
		"access":                 worldtest.Access(5, 40, 40),
	} {
		t.Run(name, func(t *testing.T) {
			in := worldtest.New(t, s)
			assert.Len(t, in.Clusters, s.Clusters)
			assert.Len(t, in.Meshes, s.Clusters)
			assert.Len(t, in.Destinations, s.Services)
			assert.Len(t, in.Workloads, 2*s.Services, "v1 and v2 of every service")
			assert.Equal(t, s.Policies, len(in.AccessPolicies)+len(in.TrafficPolicies))
			assert.Equal(t, s.Federation != worldtest.NoVirtualMesh, len(in.VirtualMeshes) == 1)
			namespaces := map[string]bool{}
			for _, d := range in.Destinations {
				namespaces[d.Spec.KubeService.Ref.Namespace] = true
			}
			assert.Len(t, namespaces, min(s.Namespaces, s.Services))

			_, r := all.Translate(in, worldtest.AdminNamespace)
			keys := r.Keys()
			assert.Len(t, keys, s.Policies+len(in.VirtualMeshes), "a status for every user object")
			for _, k := range keys {
				st, _, _ := r.Status(k)
				assert.Equal(t, common.StateAccepted, st.State, "%v: %v", k, st.Errors)
				assert.Empty(t, st.Warnings, "%v", k)
			}
		})
	}
}

// The federating fleets federate what they say: FederatePublic every fifth
// service, FederateAll every one, each to every other mesh.
func TestFederationReachesWhatItSays(t *testing.T) {
	for name, tc := range map[string]struct {
		s         worldtest.Spec
		federated int
	}{
		"public": {worldtest.Access(4, 20, 0), 4},
		"all":    {worldtest.Translation(4, 20, 0, true), 20},
	} {
		t.Run(name, func(t *testing.T) {
			out, _ := all.Translate(worldtest.New(t, tc.s), worldtest.AdminNamespace)
			rules := 0
			for _, o := range out.Objects() {
				if o.Object.GetKind() == "DestinationRule" {
					rules++
				}
			}
			assert.Equal(t, tc.federated*(tc.s.Clusters-1), rules, "one DestinationRule per federated service in every other mesh")
		})
	}
}

// The same Spec gives the same world, object for object.
func TestWorldsAreDeterministic(t *testing.T) {
	s := worldtest.Access(3, 30, 30)
	a, b := worldtest.New(t, s), worldtest.New(t, s)
	require.Equal(t, a, b)
	a.Destinations[0].Spec.KubeService.Subsets["version"][0] = "edited"
	assert.Equal(t, "v1", a.Destinations[1].Spec.KubeService.Subsets["version"][0], "Destinations share no slice")
}

// WithUIDs gives every object its own UID and a generation.
func TestWithUIDsGivesEveryObjectAUID(t *testing.T) {
	in := worldtest.New(t, worldtest.Translation(3, 6, 6, true))
	in.VirtualDestinations = []networkingv1alpha1.VirtualDestination{{ObjectMeta: metav1.ObjectMeta{Name: "vd"}}}
	objs := worldtest.Objects(worldtest.WithUIDs(in))
	require.Len(t, objs, 3+3+12+6+3+3+1+1, "meshes, clusters, workloads, destinations, policies, the VirtualMesh and VirtualDestination")
	assert.Equal(t, "vd", objs[len(objs)-4].GetName(), "Objects includes VirtualDestinations")
	uids := map[types.UID]bool{}
	for _, o := range objs {
		assert.NotEmpty(t, o.GetUID(), o.GetName())
		assert.False(t, uids[o.GetUID()], "UID %s twice", o.GetUID())
		uids[o.GetUID()] = true
		assert.GreaterOrEqual(t, o.GetGeneration(), int64(1), o.GetName())
	}
}

// A Spec that cannot be built fails the test that asked for it, naming
// why, and builds nothing.
func TestAnImpossibleSpecFailsTheTest(t *testing.T) {
	for name, s := range map[string]worldtest.Spec{
		"negative clusters":         {Clusters: -1},
		"services without clusters": {Services: 3},
		"policies without services": {Clusters: 1, Policies: 3, Mix: []worldtest.PolicyKind{worldtest.AllowNextAccount}},
		"policies without a mix":    {Clusters: 1, Services: 3, Policies: 3},
		"an unknown policy kind":    {Clusters: 1, Services: 3, Policies: 3, Mix: []worldtest.PolicyKind{worldtest.ShiftSubsets + 1}},
	} {
		t.Run(name, func(t *testing.T) {
			tb := &fatalRecorder{TB: t}
			var in *translation.Input
			var wg sync.WaitGroup
			wg.Go(func() { in = worldtest.New(tb, s) })
			wg.Wait()
			assert.Nil(t, in, "nothing is built")
			assert.Contains(t, tb.msg, "worldtest:")
		})
	}
}

// fatalRecorder is a testing.TB whose Fatalf records the message and
// stops its goroutine, as the real one does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
