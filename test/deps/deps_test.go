// Package deps proves that hack/deps.sh, the set-up step of `make test`,
// `make demo`, `make gen` and `make image`, installs what a fresh Debian
// machine lacks. It runs the script for real, with apt-get, inside a
// copy-on-write view of this machine (an overlay over / in a private mount
// namespace, entered with chroot) from which the packages were removed first:
// the machine itself is never changed.
package deps

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/relaymesh/relaymesh/test/localcluster"
)

// overlayScript runs in a new mount namespace: $1 is a scratch directory,
// $2 the repository. It prints "==> NAME rc=N" after each step.
const overlayScript = `
set -u
t=$1 repo=$2
mount -t tmpfs tmpfs "$t"
mkdir -p "$t/upper" "$t/work" "$t/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$t/upper,workdir=$t/work" "$t/root" || exit 90
mount --bind /dev "$t/root/dev"
mount -t proc proc "$t/root/proc"
mount -t sysfs sysfs "$t/root/sys"
mount -t tmpfs tmpfs "$t/root/tmp"
mkdir -p "$t/root/repo" && mount --bind "$repo" "$t/root/repo"
inside() { chroot "$t/root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root /bin/bash -c "cd /repo && $1"; }
step() { local name=$1; shift; inside "$*" 2>&1; echo "==> $name rc=$?"; }

# A fresh machine: none of the packages the targets need.
step remove 'DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq gcc softhsm2 protobuf-compiler >/dev/null; for c in gcc softhsm2-util protoc; do command -v $c && exit 1; done; exit 0'
step check-missing 'hack/deps.sh --check test gen'
step not-root 'setpriv --reuid=65534 --regid=65534 --clear-groups hack/deps.sh test gen'
step no-apt 'mv /usr/bin/apt-get /usr/bin/apt-get.off; hack/deps.sh test gen; rc=$?; mv /usr/bin/apt-get.off /usr/bin/apt-get; exit $rc'
step install 'hack/deps.sh test gen'
step present 'for c in gcc softhsm2-util protoc; do command -v $c || exit 1; done; test -s /etc/ssl/certs/ca-certificates.crt'
step again 'hack/deps.sh test gen'
`

// TestDepsInstallsWhatIsMissing removes gcc, softhsm2 and protoc from an
// overlay of this machine, then checks that hack/deps.sh refuses clearly
// without root or apt-get, installs all three with apt-get, and has nothing
// to do afterwards.
func TestDepsInstallsWhatIsMissing(t *testing.T) {
	localcluster.SkipIfShort(t)
	if runtime.GOOS != "linux" {
		t.Fatalf("hack/deps.sh is for Debian; this is %s", runtime.GOOS)
	}
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("CI runs as root: this test needs root for mount namespaces and apt-get")
		}
		t.Skip("needs root (mount namespace, overlay, apt-get); CI runs it")
	}
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--pid", "--fork", "--propagation", "private",
		"bash", "-c", overlayScript, "overlay", t.TempDir(), root)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Logf("hack/deps.sh in an overlay: %s", time.Since(start).Round(time.Second))

	steps := parseSteps(string(out))
	expect := func(name string, rc string, contains ...string) {
		t.Helper()
		s, ok := steps[name]
		require.True(t, ok, "step %s did not run:\n%s", name, out)
		require.Equal(t, rc, s.rc, "step %s:\n%s", name, s.out)
		for _, c := range contains {
			require.Contains(t, s.out, c, "step %s", name)
		}
	}
	expect("remove", "0")
	expect("check-missing", "1", "deps: missing for test gen: gcc softhsm2 protobuf-compiler")
	expect("not-root", "1", "installing them needs root", "sudo apt-get install -y gcc softhsm2 protobuf-compiler")
	expect("no-apt", "1", "there is no apt-get here")
	expect("install", "0", "deps: installing gcc softhsm2 protobuf-compiler (for test gen)", "deps: installed gcc softhsm2 protobuf-compiler")
	expect("present", "0", "/usr/bin/softhsm2-util", "/usr/bin/protoc", "/usr/bin/gcc")
	expect("again", "0", "deps: nothing to install for test gen")
}

type stepResult struct{ out, rc string }

var stepEnd = regexp.MustCompile(`^==> (\S+) rc=(\d+)$`)

// parseSteps splits the script's output at its "==> NAME rc=N" lines.
func parseSteps(out string) map[string]stepResult {
	steps := map[string]stepResult{}
	var buf strings.Builder
	for _, line := range strings.Split(out, "\n") {
		if m := stepEnd.FindStringSubmatch(line); m != nil {
			steps[m[1]] = stepResult{out: buf.String(), rc: m[2]}
			buf.Reset()
			continue
		}
		buf.WriteString(line + "\n")
	}
	return steps
}
