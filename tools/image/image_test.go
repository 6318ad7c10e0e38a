package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wantFiles is everything the image holds: no shell, no package manager,
// nothing but the binary, the users and the CA bundle.
var wantFiles = []string{
	"etc", "etc/group", "etc/passwd", "etc/ssl", "etc/ssl/certs", "etc/ssl/certs/ca-certificates.crt",
	"home", "home/nonroot", "tmp",
	"usr", "usr/local", "usr/local/bin", "usr/local/bin/relaymesh",
}

// TestImage runs what `make image` runs (the charts' appVersion and image
// repository as version and name) and inspects the result: one index for
// linux/amd64 and linux/arm64, each image non-root with relaymesh as its
// entry point, OCI labels, exactly the expected files, a static binary of
// the right architecture; the layout and its tar archive agree; and a
// second build of the same commit gives the same digest.
func TestImage(t *testing.T) {
	version, repository := chartImage(t)
	// Under directories that do not exist yet, like _out/ of a fresh clone.
	dir, tarPath := filepath.Join(t.TempDir(), "_out", "image"), filepath.Join(t.TempDir(), "_out", "image.tar")
	start := time.Now()
	out := makeImage(t, "--out", dir, "--tar", tarPath, "--version", version, "--repository", repository)
	t.Logf("make image's build: %s\n%s", time.Since(start).Round(time.Second), out)

	lp, err := layout.FromPath(dir)
	require.NoError(t, err)
	top, err := lp.ImageIndex()
	require.NoError(t, err)
	topm, err := top.IndexManifest()
	require.NoError(t, err)
	require.Len(t, topm.Manifests, 1, "one index in the layout, what crane push DIR REF pushes")
	require.Equal(t, types.OCIImageIndex, topm.Manifests[0].MediaType)
	ref := repository + ":" + version
	require.Equal(t, ref, topm.Manifests[0].Annotations[LabelRefName], "the charts' default image")

	idx, err := top.ImageIndex(topm.Manifests[0].Digest)
	require.NoError(t, err)
	im, err := idx.IndexManifest()
	require.NoError(t, err)
	require.Equal(t, version, im.Annotations[LabelVersion])
	rev := im.Annotations[LabelRevision]
	require.Regexp(t, `^[0-9a-f]{40}(-dirty)?$`, rev)
	require.Equal(t, "https://github.com/relaymesh/relaymesh", im.Annotations[LabelSource])

	var platforms []string
	for _, d := range im.Manifests {
		require.NotNil(t, d.Platform)
		platforms = append(platforms, d.Platform.String())
		require.Equal(t, types.OCIManifestSchema1, d.MediaType)
		img, err := idx.Image(d.Digest)
		require.NoError(t, err)
		inspectImage(t, img, *d.Platform, version, rev)
	}
	sort.Strings(platforms)
	require.Equal(t, []string{"linux/amd64", "linux/arm64"}, platforms)

	// The archive holds exactly the layout's files.
	inTar := tarFiles(t, tarPath)
	var inDir []string
	require.NoError(t, filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			inDir = append(inDir, rel)
		}
		return err
	}))
	sort.Strings(inDir)
	require.Equal(t, inDir, inTar)
	require.Contains(t, inTar, "oci-layout")
	require.Contains(t, inTar, "index.json")

	// Pushable: what `crane push DIR REF` does with this layout (its one
	// index, written to a registry), here to an in-memory registry, and
	// pulled back by tag for each platform.
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	pushed, err := name.ParseReference(strings.TrimPrefix(reg.URL, "http://") + "/relaymesh/relaymesh:" + version)
	require.NoError(t, err)
	require.NoError(t, remote.WriteIndex(pushed, idx))
	want, err := idx.Digest()
	require.NoError(t, err)
	got, err := remote.Index(pushed)
	require.NoError(t, err)
	gotDigest, err := got.Digest()
	require.NoError(t, err)
	require.Equal(t, want, gotDigest)
	for _, arch := range []string{"amd64", "arm64"} {
		img, err := remote.Image(pushed, remote.WithPlatform(v1.Platform{OS: "linux", Architecture: arch}))
		require.NoError(t, err)
		cf, err := img.ConfigFile()
		require.NoError(t, err)
		require.Equal(t, arch, cf.Architecture)
		require.Equal(t, "65532:65532", cf.Config.User)
	}

	// Same commit, same image (the amd64 one; the Go build cache makes this
	// quick).
	again := filepath.Join(t.TempDir(), "again")
	makeImage(t, "--out", again, "--version", version, "--repository", repository, "--platforms", "linux/amd64")
	lp2, err := layout.ImageIndexFromPath(again)
	require.NoError(t, err)
	m2, err := lp2.IndexManifest()
	require.NoError(t, err)
	idx2, err := lp2.ImageIndex(m2.Manifests[0].Digest)
	require.NoError(t, err)
	im2, err := idx2.IndexManifest()
	require.NoError(t, err)
	for _, d := range im.Manifests {
		if d.Platform.Architecture == "amd64" {
			require.Equal(t, d.Digest, im2.Manifests[0].Digest, "a rebuild of the same commit is byte for byte the same image")
		}
	}
}

// makeImage runs the command `make image` runs (go run . in tools/image,
// not under the race detector) and returns its output.
func makeImage(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"run", ".", "--repo", "../.."}, args...)...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return string(out)
}

// inspectImage checks one platform's image.
func inspectImage(t *testing.T, img v1.Image, p v1.Platform, version, rev string) {
	t.Helper()
	cf, err := img.ConfigFile()
	require.NoError(t, err)
	assert.Equal(t, p.OS, cf.OS)
	assert.Equal(t, p.Architecture, cf.Architecture)
	assert.Equal(t, "65532:65532", cf.Config.User, "non-root user")
	assert.Equal(t, []string{"/usr/local/bin/relaymesh"}, cf.Config.Entrypoint)
	assert.Empty(t, cf.Config.Cmd)
	assert.Equal(t, version, cf.Config.Labels[LabelVersion])
	assert.Equal(t, rev, cf.Config.Labels[LabelRevision])
	assert.Equal(t, "https://github.com/relaymesh/relaymesh", cf.Config.Labels[LabelSource])
	m, err := img.Manifest()
	require.NoError(t, err)
	assert.Equal(t, types.OCIConfigJSON, m.Config.MediaType)
	require.Len(t, m.Layers, 2, "base (users, CA bundle) and binary")
	for _, l := range m.Layers {
		assert.Equal(t, types.OCILayer, l.MediaType)
	}
	assert.Equal(t, version, m.Annotations[LabelVersion])

	files := map[string]*tar.Header{}
	content := map[string][]byte{}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		files[h.Name] = h
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		content[h.Name] = b
	}
	var names []string
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	require.Equal(t, wantFiles, names, "%s: exactly these files (no shell)", p.String())
	for _, n := range names {
		assert.NotRegexp(t, `(^|/)(sh|bash|busybox)$`, n)
	}
	assert.Contains(t, string(content["etc/passwd"]), "nonroot:x:65532:65532:")
	assert.Equal(t, int64(0o1777), files["tmp"].Mode&0o7777, "/tmp: sticky, world-writable")
	assert.Equal(t, 65532, files["home/nonroot"].Uid)
	assert.Equal(t, int64(0o755), files["usr/local/bin/relaymesh"].Mode&0o7777)
	assert.Equal(t, 0, files["usr/local/bin/relaymesh"].Uid, "the binary belongs to root: the user cannot replace it")
	host, err := os.ReadFile(CABundle)
	require.NoError(t, err)
	assert.Equal(t, host, content["etc/ssl/certs/ca-certificates.crt"], "the Debian ca-certificates bundle")

	bin := content["usr/local/bin/relaymesh"]
	f, err := elf.NewFile(bytes.NewReader(bin))
	require.NoError(t, err, "%s: relaymesh is an ELF binary", p.String())
	want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[p.Architecture]
	assert.Equal(t, want, f.Machine, "%s: binary architecture", p.String())
	for _, prog := range f.Progs {
		assert.NotEqual(t, elf.PT_INTERP, prog.Type, "%s: static binary (no dynamic loader)", p.String())
		assert.NotEqual(t, elf.PT_DYNAMIC, prog.Type, "%s: static binary (no dynamic section)", p.String())
	}
	if p.Architecture == runtime.GOARCH {
		// It runs with nothing around it.
		path := filepath.Join(t.TempDir(), "relaymesh")
		require.NoError(t, os.WriteFile(path, bin, 0o755))
		cmd := exec.Command(path, "version", "--client") // the server is not asked: nothing is around it
		cmd.Env = []string{}
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		assert.Regexp(t, `(?m)^client\s+`+regexp.QuoteMeta(version)+`\s`, string(out), "the image's version is linked in, not devel")
	}
}

func tarFiles(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	tr := tar.NewReader(f)
	var names []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		names = append(names, h.Name)
	}
	sort.Strings(names)
	return names
}

// chartImage reads the charts' default image: both charts' appVersion and
// values image.repository, which must agree.
func chartImage(t *testing.T) (version, repository string) {
	t.Helper()
	appVersion := regexp.MustCompile(`(?m)^appVersion:\s*"?([^"\s]+)"?\s*$`)
	repo := regexp.MustCompile(`(?m)^image:\s*\n(?:\s+#.*\n)*\s+repository:\s*(\S+)\s*$`)
	for _, chart := range []string{"relaymesh-server", "relaymesh-agent"} {
		c, err := os.ReadFile(filepath.Join("../../charts", chart, "Chart.yaml"))
		require.NoError(t, err)
		m := appVersion.FindSubmatch(c)
		require.NotNil(t, m, "%s: appVersion", chart)
		v, err := os.ReadFile(filepath.Join("../../charts", chart, "values.yaml"))
		require.NoError(t, err)
		r := repo.FindSubmatch(v)
		require.NotNil(t, r, "%s: image.repository in values.yaml", chart)
		if version == "" {
			version, repository = string(m[1]), string(r[1])
		}
		require.Equal(t, version, string(m[1]), "%s: appVersion differs from relaymesh-server's", chart)
		require.Equal(t, repository, string(r[1]), "%s: image.repository differs from relaymesh-server's", chart)
	}
	return version, repository
}

func TestConfigValidate(t *testing.T) {
	err := Config{Platforms: []v1.Platform{{OS: "windows", Architecture: "amd64"}, {OS: "linux"}, {OS: "linux", Architecture: "arm64"}, {OS: "linux", Architecture: "arm64"}}}.Validate()
	require.Error(t, err)
	for _, want := range []string{"repoRoot: required", "version: required", "revision: required", "created: required",
		"platforms[0]: windows/amd64: only linux", "platforms[1]: architecture required", "platforms[3]: linux/arm64 listed twice"} {
		assert.Contains(t, err.Error(), want)
	}
	require.NoError(t, Config{RepoRoot: ".", Version: "1", Revision: "r", Created: time.Unix(1, 0)}.Default().Validate())
	// The version is linked in with -ldflags -X: nothing that would split
	// or quote the flag.
	for _, bad := range []string{"1.0 -X main.x=y", "1'0", `1"0`, "1\n0", strings.Repeat("1", 129)} {
		err := Config{RepoRoot: ".", Version: bad, Revision: "r", Created: time.Unix(1, 0)}.Default().Validate()
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), "letters, digits")
	}
	require.NoError(t, Config{RepoRoot: ".", Version: "0.4.0-rc.1+build_7", Revision: "r", Created: time.Unix(1, 0)}.Default().Validate())
}
