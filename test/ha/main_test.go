package ha_test

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/relaymesh/relaymesh/test/localcluster"
)

// bin is the relaymesh binary built from this checkout for the whole run.
var bin string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		// -short (make test-unit): Setup skips every test that needs bin.
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "relaymesh-ha-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin, err = localcluster.BuildRelaymesh(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
