package policy_test

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/relaymesh/relaymesh/policy"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/translationtest"
	"github.com/stretchr/testify/require"
)

type translateFunc func(*translation.Input, *translation.Output, *translation.Report)

func TestAccessGolden(t *testing.T)  { runGolden(t, "access", policy.TranslateAccess) }
func TestTrafficGolden(t *testing.T) { runGolden(t, "traffic", policy.TranslateTraffic) }

// runGolden translates every testdata/<kind>/<case>/input.yaml, compares the
// result with the case's output.yaml and status.yaml, and checks every
// output with istioctl and a dry run on one shared real kube-apiserver.
func runGolden(t *testing.T, kind string, translate translateFunc) {
	dirs, err := filepath.Glob(filepath.Join("testdata", kind, "*"))
	require.NoError(t, err)
	require.NotEmpty(t, dirs)

	for _, dir := range dirs {
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			continue
		}
		t.Run(filepath.Base(dir), func(t *testing.T) {
			in := translationtest.LoadInput(t, dir)
			out, r := translation.NewOutput(), translation.NewReport()
			translate(in, out, r)
			translationtest.Golden(t, dir, out, r)

			for i := range 5 {
				sOut, sR := translation.NewOutput(), translation.NewReport()
				translate(shuffled(in, uint64(i)), sOut, sR)
				require.Equal(t, string(translationtest.RenderOutput(t, out)), string(translationtest.RenderOutput(t, sOut)), "output depends on input order")
				require.Equal(t, string(translationtest.RenderReport(t, r)), string(translationtest.RenderReport(t, sR)), "status depends on input order")
			}

			if len(out.Objects()) == 0 {
				return
			}
			translationtest.Admitted(t, out)
		})
	}
}

// shuffled returns a copy of in with every list in another order.
func shuffled(in *translation.Input, seed uint64) *translation.Input {
	rnd := rand.New(rand.NewPCG(seed, seed+1))
	c := *in
	c.Meshes = shuffle(rnd, in.Meshes)
	c.Workloads = shuffle(rnd, in.Workloads)
	c.Destinations = shuffle(rnd, in.Destinations)
	c.TrafficPolicies = shuffle(rnd, in.TrafficPolicies)
	c.AccessPolicies = shuffle(rnd, in.AccessPolicies)
	return &c
}

func shuffle[T any](rnd *rand.Rand, s []T) []T {
	out := append([]T(nil), s...)
	rnd.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// Partial input must never panic: every translator sees empty and
// half-filled objects.
func TestPartialInput(t *testing.T) {
	in := translationtest.LoadInput(t, filepath.Join("testdata", "access", "service-accounts-across-clusters"))
	for _, translate := range []translateFunc{policy.TranslateAccess, policy.TranslateTraffic} {
		translate(&translation.Input{}, translation.NewOutput(), translation.NewReport())
		partial := *in
		partial.Meshes = nil
		translate(&partial, translation.NewOutput(), translation.NewReport())
	}
}
