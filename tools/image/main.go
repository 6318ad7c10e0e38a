// Command image builds Relaymesh's container image without a daemon or a
// registry (`make image`): a static relaymesh binary per platform
// (CGO_ENABLED=0), a non-root user, the CA certificates of the build
// machine's Debian ca-certificates bundle, and nothing else (no shell, no
// package manager). The result is an OCI image layout directory holding one
// image index (linux/amd64 and linux/arm64 by default), and the same layout
// as a tar archive; `crane push DIR REF` pushes it (docs/install.md).
//
// Everything is reproducible from the commit: file times, the image's
// creation time and the binaries (-trimpath, no build ID) come from the
// commit, or from SOURCE_DATE_EPOCH when it is set.
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// What the image holds, and where.
const (
	BinaryPath = "/usr/local/bin/relaymesh"
	CABundle   = "/etc/ssl/certs/ca-certificates.crt"
	// UID and GID of the image's only user besides root, "nonroot" (the
	// distroless convention); the charts run as it.
	UID = 65532
	GID = 65532
)

// OCI annotation keys the image carries as config labels and manifest
// annotations.
const (
	LabelVersion  = "org.opencontainers.image.version"
	LabelRevision = "org.opencontainers.image.revision"
	LabelSource   = "org.opencontainers.image.source"
	LabelCreated  = "org.opencontainers.image.created"
	LabelTitle    = "org.opencontainers.image.title"
	LabelDesc     = "org.opencontainers.image.description"
	LabelRefName  = "org.opencontainers.image.ref.name"
)

// Config says what to build.
type Config struct {
	// RepoRoot is the Relaymesh checkout to build cmd/relaymesh from.
	RepoRoot string
	// Platforms to build, linux only; default linux/amd64 and linux/arm64.
	Platforms []v1.Platform
	// Version, Revision and Source become the OCI labels; Ref (a reference
	// such as ghcr.io/relaymesh/relaymesh:0.1.0) names the index in the
	// layout. Version and Revision are required.
	Version, Revision, Source, Ref string
	// Created is the image's creation time and every file's time.
	Created time.Time
	// CABundle is the PEM bundle copied to /etc/ssl/certs; default the
	// Debian ca-certificates bundle of this machine.
	CABundle string
	// Log receives progress lines; default discarded.
	Log io.Writer
}

// Default fills the zero fields that have defaults.
func (c Config) Default() Config {
	if len(c.Platforms) == 0 {
		c.Platforms = []v1.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm64"}}
	}
	if c.CABundle == "" {
		c.CABundle = CABundle
	}
	if c.Source == "" {
		c.Source = "https://github.com/relaymesh/relaymesh"
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	return c
}

// Validate reports every problem with c.
func (c Config) Validate() error {
	var errs []error
	if c.RepoRoot == "" {
		errs = append(errs, errors.New("repoRoot: required"))
	}
	if c.Version == "" {
		errs = append(errs, errors.New("version: required"))
	} else if strings.Trim(c.Version, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.+_-") != "" || len(c.Version) > 128 {
		// It is linked into the binary with -ldflags -X: no spaces or quotes.
		errs = append(errs, fmt.Errorf("version %q: letters, digits, '.', '+', '_' and '-' only, at most 128", c.Version))
	}
	if c.Revision == "" {
		errs = append(errs, errors.New("revision: required"))
	}
	if c.Created.IsZero() {
		errs = append(errs, errors.New("created: required"))
	}
	seen := map[string]bool{}
	for i, p := range c.Platforms {
		switch {
		case p.OS != "linux":
			errs = append(errs, fmt.Errorf("platforms[%d]: %s: only linux images are built", i, p.String()))
		case p.Architecture == "":
			errs = append(errs, fmt.Errorf("platforms[%d]: architecture required", i))
		case seen[p.String()]:
			errs = append(errs, fmt.Errorf("platforms[%d]: %s listed twice", i, p.String()))
		}
		seen[p.String()] = true
	}
	return errors.Join(errs...)
}

func (c Config) labels() map[string]string {
	return map[string]string{
		LabelVersion:  c.Version,
		LabelRevision: c.Revision,
		LabelSource:   c.Source,
		LabelCreated:  c.Created.UTC().Format(time.RFC3339),
		LabelTitle:    "relaymesh",
		LabelDesc:     "Relaymesh management server and relay agent (one static binary: relaymesh server | relaymesh agent)",
	}
}

// Build compiles relaymesh for every platform and returns the image index.
func Build(ctx context.Context, cfg Config) (v1.ImageIndex, error) {
	cfg = cfg.Default()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	caPEM, err := os.ReadFile(cfg.CABundle)
	if err != nil {
		return nil, fmt.Errorf("CA bundle (Debian: apt-get install ca-certificates, or make deps): %w", err)
	}
	if !bytes.Contains(caPEM, []byte("-----BEGIN CERTIFICATE-----")) {
		return nil, fmt.Errorf("CA bundle %s holds no PEM certificate", cfg.CABundle)
	}
	base, err := baseLayer(cfg.Created, caPEM)
	if err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "relaymesh-image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	var idx v1.ImageIndex = empty.Index
	idx = mutate.IndexMediaType(idx, types.OCIImageIndex)
	for _, p := range cfg.Platforms {
		bin := filepath.Join(work, "relaymesh-"+p.Architecture+p.Variant)
		start := time.Now()
		if err := goBuild(ctx, cfg, p, bin); err != nil {
			return nil, err
		}
		fmt.Fprintf(cfg.Log, "image: built relaymesh for %s in %s\n", p.String(), time.Since(start).Round(time.Second))
		img, err := platformImage(cfg, p, base, bin)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.String(), err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &p}})
	}
	anns := cfg.labels()
	if cfg.Ref != "" {
		anns[LabelRefName] = cfg.Ref
	}
	idx, ok := mutate.Annotations(idx, anns).(v1.ImageIndex)
	if !ok {
		return nil, errors.New("annotated index is not an index")
	}
	return idx, nil
}

// goBuild compiles a static relaymesh for p into out.
func goBuild(ctx context.Context, cfg Config, p v1.Platform, out string) error {
	// The version is linked in (relaymesh version, relaymesh_build_info):
	// a build without VCS information would otherwise say "devel".
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid= -X main.releaseVersion="+cfg.Version, "-o", out, "./cmd/relaymesh")
	cmd.Dir = cfg.RepoRoot
	env := []string{"CGO_ENABLED=0", "GOOS=" + p.OS, "GOARCH=" + p.Architecture, "GOFLAGS="}
	if p.Architecture == "arm" && p.Variant != "" {
		env = append(env, "GOARM="+strings.TrimPrefix(p.Variant, "v"))
	}
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build relaymesh for %s: %w: %s", p.String(), err, stderr.String())
	}
	return nil
}

// platformImage is the base layer, the binary's layer and the config.
func platformImage(cfg Config, p v1.Platform, base v1.Layer, bin string) (v1.Image, error) {
	b, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	binLayer, err := layer(cfg.Created, []entry{
		{name: "usr/", mode: 0o755, dir: true},
		{name: "usr/local/", mode: 0o755, dir: true},
		{name: "usr/local/bin/", mode: 0o755, dir: true},
		{name: strings.TrimPrefix(BinaryPath, "/"), mode: 0o755, data: b},
	})
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.AppendLayers(img, base, binLayer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Created = v1.Time{Time: cfg.Created.UTC()}
	cf.Author = "Relaymesh"
	cf.Config = v1.Config{
		User:       strconv.Itoa(UID) + ":" + strconv.Itoa(GID),
		Entrypoint: []string{BinaryPath},
		WorkingDir: "/",
		Env:        []string{"PATH=/usr/local/bin", "SSL_CERT_FILE=" + CABundle},
		Labels:     cfg.labels(),
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, err
	}
	out, ok := mutate.Annotations(img, cfg.labels()).(v1.Image)
	if !ok {
		return nil, errors.New("annotated image is not an image")
	}
	return out, nil
}

// baseLayer holds the users, the CA bundle and a world-writable /tmp.
func baseLayer(created time.Time, caPEM []byte) (v1.Layer, error) {
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", UID, GID)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", GID)
	return layer(created, []entry{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/passwd", mode: 0o644, data: []byte(passwd)},
		{name: "etc/group", mode: 0o644, data: []byte(group)},
		{name: "etc/ssl/", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/", mode: 0o755, dir: true},
		{name: strings.TrimPrefix(CABundle, "/"), mode: 0o644, data: caPEM},
		{name: "home/", mode: 0o755, dir: true},
		{name: "home/nonroot/", mode: 0o700, dir: true, uid: UID, gid: GID},
		{name: "tmp/", mode: 0o1777, dir: true},
	})
}

type entry struct {
	name     string
	mode     int64
	dir      bool
	data     []byte
	uid, gid int
}

// layer is a gzip-compressed OCI layer of entries, in order, with time t.
func layer(t time.Time, entries []entry) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, ModTime: t.UTC(), Uid: e.uid, Gid: e.gid, Format: tar.FormatPAX}
		if e.uid == 0 {
			h.Uname, h.Gname = "root", "root"
		} else {
			h.Uname, h.Gname = "nonroot", "nonroot"
		}
		if e.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
}

// Write replaces dir with an OCI image layout holding idx, and, if tarPath
// is not empty, writes the same layout as a tar archive there.
func Write(idx v1.ImageIndex, dir, tarPath string, ref string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	for _, d := range []string{filepath.Dir(dir), filepath.Dir(tarPath)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	var opts []layout.Option
	if ref != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{LabelRefName: ref}))
	}
	if err := p.AppendIndex(idx, opts...); err != nil {
		return err
	}
	if tarPath == "" {
		return nil
	}
	return tarDir(dir, tarPath)
}

// tarDir archives dir's files (sorted, fixed times) into path.
func tarDir(dir, path string) error {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(files)
	f, err := os.Create(path + ".tmp")
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0).UTC()}); err != nil {
			return err
		}
		if _, err := tw.Write(b); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

// run is the command: flags, then Build and Write.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	repo := fs.String("repo", "../..", "the Relaymesh checkout")
	out := fs.String("out", "", "OCI image layout directory to write (replaced)")
	tarPath := fs.String("tar", "", "also write the layout as this tar archive")
	version := fs.String("version", "", "image version (the charts' appVersion)")
	repository := fs.String("repository", "ghcr.io/relaymesh/relaymesh", "repository the image is named for (the charts' image.repository)")
	platforms := fs.String("platforms", "linux/amd64,linux/arm64", "comma-separated platforms")
	caBundle := fs.String("ca-bundle", CABundle, "PEM CA bundle to include")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || *version == "" || fs.NArg() != 0 {
		return errors.New("usage: image --out DIR --version VERSION [--tar FILE] [--repo DIR] [--repository REPO] [--platforms LIST]")
	}
	root, err := filepath.Abs(*repo)
	if err != nil {
		return err
	}
	rev, created, err := commit(ctx, root)
	if err != nil {
		return err
	}
	cfg := Config{RepoRoot: root, Version: *version, Revision: rev, Created: created, CABundle: *caBundle,
		Ref: *repository + ":" + *version, Log: stdout}
	for _, s := range strings.Split(*platforms, ",") {
		p, err := v1.ParsePlatform(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("--platforms: %w", err)
		}
		cfg.Platforms = append(cfg.Platforms, *p)
	}
	idx, err := Build(ctx, cfg)
	if err != nil {
		return err
	}
	if err := Write(idx, *out, *tarPath, cfg.Ref); err != nil {
		return err
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "image: %s (%s, revision %s) written to %s\n", cfg.Ref, d, rev, *out)
	if *tarPath != "" {
		fmt.Fprintf(stdout, "image: the same layout as an archive: %s\n", *tarPath)
	}
	return nil
}

// commit returns HEAD (with -dirty when the tree has changes) and the
// time to stamp the image with: SOURCE_DATE_EPOCH, else HEAD's commit time.
func commit(ctx context.Context, root string) (string, time.Time, error) {
	git := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out)), nil
	}
	rev, err := git("rev-parse", "HEAD")
	if err != nil {
		return "", time.Time{}, err
	}
	if st, err := git("status", "--porcelain", "--untracked-files=no"); err != nil {
		return "", time.Time{}, err
	} else if st != "" {
		rev += "-dirty"
	}
	epoch := os.Getenv("SOURCE_DATE_EPOCH")
	if epoch == "" {
		if epoch, err = git("log", "-1", "--format=%ct"); err != nil {
			return "", time.Time{}, err
		}
	}
	sec, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("commit time %q: %w", epoch, err)
	}
	return rev, time.Unix(sec, 0).UTC(), nil
}
