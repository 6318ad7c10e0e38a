package fleet_test

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/relaymesh/relaymesh/test/fleet"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/require"
)

// Flags for runs by hand; `make bench` and `make test` use the defaults.
var (
	binFlag = flag.String("fleet.bin", "", "relaymesh binary to measure (default $"+fleet.BinaryEnv+", else one built from this checkout)")
	keepDir = flag.String("fleet.dir", "", "keep logs, audit logs and cluster data under this directory (default: a temporary one)")
)

// built is the binary built from this checkout, once per test process.
var built struct {
	once      sync.Once
	dir, path string
	err       error
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// binary is the relaymesh binary under test.
func binary(t testing.TB) string {
	t.Helper()
	localcluster.SkipIfShort(t)
	if *binFlag != "" || os.Getenv(fleet.BinaryEnv) != "" {
		bin, err := fleet.ResolveBinary(*binFlag, "")
		require.NoError(t, err)
		return bin
	}
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "fleet-bin-")
		if built.err == nil {
			built.path, built.err = localcluster.BuildRelaymesh(built.dir)
		}
	})
	require.NoError(t, built.err)
	return built.path
}

// startEnv starts a management cluster that stops with the test.
func startEnv(t testing.TB) *fleet.Env {
	t.Helper()
	localcluster.SkipIfShort(t)
	dir := t.TempDir()
	if *keepDir != "" {
		dir = filepath.Join(*keepDir, filepath.Base(t.Name()))
		require.NoError(t, os.MkdirAll(dir, 0o700))
	}
	env, err := fleet.StartEnv(context.Background(), fleet.EnvConfig{Dir: dir, Binary: binary(t)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, env.Stop()) })
	return env
}
