package catest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/relaymesh/relaymesh/test/localcluster"
)

// softHSMModulePaths are where Debian's softhsm2 package installs the
// PKCS#11 module.
var softHSMModulePaths = []string{
	"/usr/lib/softhsm/libsofthsm2.so",
	"/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
	"/usr/lib/aarch64-linux-gnu/softhsm/libsofthsm2.so",
}

// softHSM is the one SoftHSM2 token of the test binary: SoftHSM reads
// SOFTHSM2_CONF once per process, when the module is first initialized.
var softHSM struct {
	once   sync.Once
	label  string // of the token the first call asked for
	module string
	err    error
}

// SoftHSM returns the path of the SoftHSM2 PKCS#11 module. The first call
// of the process creates a token labelled label, with the user PIN pin and
// the security officer PIN soPIN, keeping its configuration and objects in
// dir (created if need be; the caller removes it), and points
// SOFTHSM2_CONF at it, so it must come before any PKCS#11 call of the
// process. Later calls return the same module; the one token there is must
// be theirs too. A missing SoftHSM2 fails the test, it does not skip it:
// CI must never pass without exercising a real token.
func SoftHSM(t testing.TB, dir, label, pin, soPIN string) string {
	t.Helper()
	localcluster.SkipIfShort(t)
	softHSM.once.Do(func() {
		softHSM.label = label
		softHSM.module, softHSM.err = initSoftHSM(dir, label, pin, soPIN)
	})
	if softHSM.err != nil {
		t.Fatalf("catest: %v", softHSM.err)
	}
	if label != softHSM.label {
		t.Fatalf("catest: SoftHSM: token %q asked for, but this process has token %q: SoftHSM2 reads its configuration once per process", label, softHSM.label)
	}
	return softHSM.module
}

func initSoftHSM(dir, label, pin, soPIN string) (string, error) {
	module := ""
	for _, p := range softHSMModulePaths {
		if _, err := os.Stat(p); err == nil {
			module = p
			break
		}
	}
	util, err := exec.LookPath("softhsm2-util")
	if module == "" || err != nil {
		return "", errors.New("SoftHSM2 is not installed: apt-get install softhsm2 (.ci/run does this)")
	}
	tokens := filepath.Join(dir, "tokens")
	conf := filepath.Join(dir, "softhsm2.conf")
	if err := os.MkdirAll(tokens, 0o700); err != nil {
		return "", err
	}
	cfg := fmt.Sprintf("directories.tokendir = %s\nobjectstore.backend = file\nlog.level = ERROR\nslots.removable = false\n", tokens)
	if err := os.WriteFile(conf, []byte(cfg), 0o600); err != nil {
		return "", err
	}
	// Before any PKCS#11 call of this process.
	if err := os.Setenv("SOFTHSM2_CONF", conf); err != nil {
		return "", err
	}
	if out, err := exec.Command(util, "--init-token", "--free", "--label", label, "--pin", pin, "--so-pin", soPIN).CombinedOutput(); err != nil {
		return "", fmt.Errorf("softhsm2-util --init-token: %w: %s", err, out)
	}
	return module, nil
}
