package istioctl

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const virtualService = `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews]
  http:
  - route:
    - destination: {host: HOST}
`

func write(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
	return p
}

// The pinned istioctl must accept good configuration and reject bad; a
// checker that accepts everything would make every translation test vacuous.
func TestValidateAndAnalyze(t *testing.T) {
	ctx := context.Background()
	good := write(t, "good.yaml", strings.Replace(virtualService, "HOST", "reviews", 1))
	bad := write(t, "bad.yaml", strings.Replace(virtualService, "HOST", `""`, 1))

	require.NoError(t, Validate(ctx, good))
	require.NoError(t, Analyze(ctx, good))

	err := Validate(ctx, bad)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "empty domain name not allowed")

	err = Analyze(ctx, bad)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "IST0106")
}
