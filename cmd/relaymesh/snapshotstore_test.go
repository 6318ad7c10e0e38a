package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/test/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
)

// The snapshot store's flags are checked before anything starts: Redis
// needs an address, TLS and a password unless plaintext is opted into by
// name, and no Redis flag is accepted without --snapshot-store=redis.
func TestSnapshotStoreFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    snapshotStoreFlags
		want []string
	}{
		{"default", snapshotStoreFlags{kind: "apiserver"}, nil},
		{"redis complete", snapshotStoreFlags{kind: "redis", address: "redis:6379", caFile: "ca.pem", passwordFile: "pw"}, nil},
		{"redis plaintext opt-in", snapshotStoreFlags{kind: "redis", address: "redis:6379", allowPlaintext: true}, nil},
		{"redis bare", snapshotStoreFlags{kind: "redis"}, []string{"needs --redis-address", "needs --redis-ca-file", "needs --redis-password-file"}},
		{"unknown store", snapshotStoreFlags{kind: "etcd2"}, []string{`--snapshot-store "etcd2": use apiserver or redis`}},
		{"a reader: nothing", snapshotStoreFlags{reader: true}, nil},
		{"a reader: --redis-address selects Redis", snapshotStoreFlags{reader: true, address: "x:1"}, []string{"--redis-address needs --redis-ca-file", "--redis-address needs --redis-password-file"}},
		{"a reader: Redis flags without an address", snapshotStoreFlags{reader: true, passwordFile: "pw", allowPlaintext: true}, []string{"--redis-password-file needs --redis-address", "--redis-allow-plaintext needs --redis-address"}},
		{"redis flags without redis", snapshotStoreFlags{kind: "apiserver", address: "x:1", caFile: "c", allowPlaintext: true},
			[]string{"--redis-address needs --snapshot-store=redis", "--redis-ca-file needs", "--redis-allow-plaintext needs"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := tc.f.validate()
			if tc.want == nil {
				assert.Empty(t, errs)
				return
			}
			var msgs []string
			for _, e := range errs {
				msgs = append(msgs, e.Error())
			}
			for _, w := range tc.want {
				assert.Contains(t, strings.Join(msgs, "\n"), w)
			}
		})
	}
}

// The replicas' record key is made once, in a Secret, and read by every
// replica; the password and CA files are read strictly.
func TestSnapshotStoreConfig(t *testing.T) {
	mgmt, cs, _ := localcluster.Management(t, "relaymesh")
	dyn, err := dynamic.NewForConfig(mgmt.RESTConfig())
	require.NoError(t, err)
	kube := &kubeclient.Clients{Typed: cs, Dynamic: dyn, Config: mgmt.RESTConfig()}
	ctx := context.Background()
	a, err := snapshotKey(ctx, kube, "relaymesh", true)
	require.NoError(t, err)
	b, err := snapshotKey(ctx, kube, "relaymesh", true)
	require.NoError(t, err)
	assert.Len(t, a, 32)
	assert.Equal(t, a, b, "every replica reads the one key")

	sec, err := cs.CoreV1().Secrets("relaymesh").Get(ctx, snapshotKeySecret, metav1.GetOptions{})
	require.NoError(t, err)
	sec.Data["key"] = []byte("short")
	_, err = cs.CoreV1().Secrets("relaymesh").Update(ctx, sec, metav1.UpdateOptions{})
	require.NoError(t, err)
	_, err = snapshotKey(ctx, kube, "relaymesh", true)
	require.ErrorContains(t, err, "at least 32 are required")
	assert.NotContains(t, err.Error(), "short")

	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o600))
	notPEM := filepath.Join(dir, "ca")
	require.NoError(t, os.WriteFile(notPEM, []byte("hello"), 0o600))
	log := slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))
	_, err = snapshotStoreFlags{kind: "redis", address: "x:1", passwordFile: empty, caFile: notPEM}.config(ctx, kube, "relaymesh", nil, log)
	assert.ErrorContains(t, err, "is empty")
	pw := filepath.Join(dir, "pw")
	require.NoError(t, os.WriteFile(pw, []byte("s3cret-pass\n"), 0o600))
	_, err = snapshotStoreFlags{kind: "redis", address: "x:1", passwordFile: pw, caFile: notPEM}.config(ctx, kube, "relaymesh", nil, log)
	assert.ErrorContains(t, err, "holds no PEM certificate")
	_, err = snapshotStoreFlags{kind: "redis", address: "x:1", passwordFile: filepath.Join(dir, "missing"), caFile: notPEM}.config(ctx, kube, "relaymesh", nil, log)
	assert.ErrorContains(t, err, "--redis-password-file")
}
