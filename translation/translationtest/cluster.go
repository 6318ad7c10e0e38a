package translationtest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/require"
)

// One kube-apiserver per test binary judges every golden output of the
// package (dry runs change nothing, so tests can share it).
var shared struct {
	once sync.Once
	env  *localcluster.Env
	dir  string
	err  error
}

// Cluster returns the package's shared API server, starting it on first use.
// The package's TestMain must end with RunMain so it is stopped.
func Cluster(t testing.TB) *localcluster.Cluster {
	t.Helper()
	localcluster.SkipIfShort(t)
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "translationtest-")
		if shared.err != nil {
			return
		}
		shared.env, shared.err = localcluster.Start(context.Background(), localcluster.Config{Dir: shared.dir, Clusters: []string{"cluster-1"}})
	})
	require.NoError(t, shared.err)
	return shared.env.Cluster("cluster-1")
}

// RunMain runs the package's tests and stops the shared API server:
//
//	func TestMain(m *testing.M) { os.Exit(translationtest.RunMain(m)) }
func RunMain(m *testing.M) int {
	code := m.Run()
	if shared.env != nil {
		if err := shared.env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "translationtest: stopping the shared API server:", err)
			code = 1
		}
	}
	if shared.dir != "" {
		_ = os.RemoveAll(shared.dir)
	}
	return code
}
