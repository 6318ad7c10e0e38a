package controller_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/relaymesh/relaymesh/translation/all"
	"github.com/relaymesh/relaymesh/translation/controller"
	"github.com/relaymesh/relaymesh/translation/translationtest"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { os.Exit(translationtest.RunMain(m)) }

// TestGolden checks cases that need every translator at once (federation and
// traffic policies sharing a DestinationRule): golden output and status,
// istioctl, and a server-side dry run on a real apiserver. The engine must
// give the same result.
func TestGolden(t *testing.T) {
	dirs, err := filepath.Glob("testdata/*")
	require.NoError(t, err)
	require.NotEmpty(t, dirs)
	for _, dir := range dirs {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			in := translationtest.LoadInput(t, dir)
			out, r := all.Translate(in, "relaymesh")
			translationtest.Golden(t, dir, out, r)
			translationtest.Admitted(t, out)

			e := controller.NewEngine("relaymesh")
			requireSameAsFull(t, e, e.Translate(in), in, "engine")
		})
	}
}
