// Package istioctl runs the pinned istioctl (built by `make tools`) over
// generated Istio configuration: `istioctl validate` for schema and semantic
// validation, and `istioctl analyze --use-kube=false` for Istio's analyzers.
// Translation tests run every output through both.
package istioctl

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/relaymesh/relaymesh/test/localcluster"
)

// Binary is the path of the pinned istioctl.
func Binary() (string, error) {
	root, err := localcluster.RepoRoot()
	if err != nil {
		return "", err
	}
	p := filepath.Join(root, ".cache", "bin", "istioctl")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("istioctl not built: run `make tools`: %w", err)
	}
	return p, nil
}

// Validate runs `istioctl validate` on the files; a non-nil error carries
// istioctl's findings.
func Validate(ctx context.Context, files ...string) error {
	args := []string{"validate"}
	for _, f := range files {
		args = append(args, "-f", f)
	}
	return runIstioctl(ctx, args)
}

// Analyze runs `istioctl analyze --use-kube=false` on the files and fails on
// any finding of level Error.
func Analyze(ctx context.Context, files ...string) error {
	args := append([]string{"analyze", "--use-kube=false", "--failure-threshold=Error", "--output-threshold=Warning"}, files...)
	return runIstioctl(ctx, args)
}

func runIstioctl(ctx context.Context, args []string) error {
	bin, err := Binary()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("istioctl %s: %w:\n%s", args[0], err, strings.TrimSpace(out.String()))
	}
	return nil
}
