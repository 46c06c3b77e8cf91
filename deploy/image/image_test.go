package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/x509"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

var update = flag.Bool("update", false, "rewrite testdata/config.golden.json")

var testSpec = spec{
	version:  "v0.1.0-test",
	revision: "0123456789abcdef0123456789abcdef01234567",
	source:   "https://github.com/capsnap/capsnap",
	created:  time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
}

var amd64 = v1.Platform{OS: "linux", Architecture: "amd64"}

func buildInfo(path string, settings ...string) *buildinfo.BuildInfo {
	bi := &debug.BuildInfo{Path: path}
	for i := 0; i+1 < len(settings); i += 2 {
		bi.Settings = append(bi.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
	}
	return bi
}

func TestCheckBuild(t *testing.T) {
	for _, c := range []struct {
		name    string
		bi      *buildinfo.BuildInfo
		want    v1.Platform
		wantErr string
	}{
		{"static linux", buildInfo(capsnapPackage, "GOOS", "linux", "GOARCH", "arm64", "CGO_ENABLED", "0", "-trimpath", "true"), v1.Platform{OS: "linux", Architecture: "arm64"}, ""},
		{"cgo", buildInfo(capsnapPackage, "GOOS", "linux", "GOARCH", "amd64", "CGO_ENABLED", "1", "-trimpath", "true"), v1.Platform{}, "CGO_ENABLED=0"},
		{"cgo unsaid", buildInfo(capsnapPackage, "GOOS", "linux", "GOARCH", "amd64", "-trimpath", "true"), v1.Platform{}, "CGO_ENABLED=0"},
		{"no trimpath", buildInfo(capsnapPackage, "GOOS", "linux", "GOARCH", "amd64", "CGO_ENABLED", "0"), v1.Platform{}, "-trimpath"},
		{"darwin", buildInfo(capsnapPackage, "GOOS", "darwin", "GOARCH", "arm64", "CGO_ENABLED", "0", "-trimpath", "true"), v1.Platform{}, "GOOS=darwin"},
		{"no arch", buildInfo(capsnapPackage, "GOOS", "linux", "CGO_ENABLED", "0", "-trimpath", "true"), v1.Platform{}, "GOARCH"},
		{"another program", buildInfo("github.com/capsnap/capsnap/examples/demo", "GOOS", "linux", "GOARCH", "amd64", "CGO_ENABLED", "0", "-trimpath", "true"), v1.Platform{}, "built from github.com/capsnap/capsnap/examples/demo"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := checkBuild(c.bi)
			if c.wantErr == "" {
				if err != nil || !reflect.DeepEqual(p, c.want) {
					t.Fatalf("checkBuild = %+v, %v; want %+v", p, err, c.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("checkBuild = %+v, %v; want an error about %s", p, err, c.wantErr)
			}
		})
	}
}

func TestSpecRequiresProvenance(t *testing.T) {
	for field, clear := range map[string]func(*spec){
		"version":  func(s *spec) { s.version = "" },
		"revision": func(s *spec) { s.revision = " " },
		"source":   func(s *spec) { s.source = "" },
	} {
		s := testSpec
		clear(&s)
		if _, err := build(s, amd64, []byte("capsnap")); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("build without %s: %v, want an error naming it", field, err)
		}
	}
}

// goldenConfig is what testdata/config.golden.json holds: the image's
// platform and runtime configuration, not its layer (whose digest moves
// with the CA certificates). examples/deploy compares it with the
// Dockerfile.
type goldenConfig struct {
	Architecture string    `json:"architecture"`
	OS           string    `json:"os"`
	Created      v1.Time   `json:"created"`
	Config       v1.Config `json:"config"`
}

func TestImageConfigGolden(t *testing.T) {
	img, err := build(testSpec, amd64, []byte("capsnap"))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.MarshalIndent(goldenConfig{cf.Architecture, cf.OS, cf.Created, cf.Config}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	golden := filepath.Join("testdata", "config.golden.json")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("image config differs from %s (go test -update to accept):\n%s", golden, got)
	}
}

func TestImage(t *testing.T) {
	binary := []byte("\x7fELF capsnap")
	img, err := build(testSpec, amd64, binary)
	if err != nil {
		t.Fatal(err)
	}
	if got := checkImage(t, img); !bytes.Equal(got, binary) {
		t.Errorf("/capsnap is %q, want the binary %q", got, binary)
	}
}

// TestArchive reads back what writeArchive wrote, and writes it again: the
// same image gives the same bytes.
func TestArchive(t *testing.T) {
	img, err := build(testSpec, amd64, []byte("capsnap"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var archives [][]byte
	for _, name := range []string{"a.tar", "b.tar"} {
		out := filepath.Join(dir, name)
		if err := writeArchive(out, img, testSpec, amd64); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		archives = append(archives, data)
	}
	if !bytes.Equal(archives[0], archives[1]) {
		t.Error("two archives of one image differ: the archive is not reproducible")
	}
	got, desc := readArchive(t, filepath.Join(dir, "a.tar"))
	if desc.Annotations[refNameAnnotation] != testSpec.version {
		t.Errorf("index.json: %s %q, want the version %q", refNameAnnotation, desc.Annotations[refNameAnnotation], testSpec.version)
	}
	if desc.Platform == nil || desc.Platform.OS != amd64.OS || desc.Platform.Architecture != amd64.Architecture {
		t.Errorf("index.json: platform %+v, want %+v", desc.Platform, amd64)
	}
	want, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if desc.Digest != want {
		t.Errorf("the archive holds %s, want the image %s", desc.Digest, want)
	}
	checkImage(t, got)
}

// TestBuiltImage checks the archive `make image` wrote, named by
// $CAPSNAP_IMAGE (make image-test sets it): the image checkImage
// describes, whose binary is a static capsnap for linux that runs and says
// the version the image is labelled with.
func TestBuiltImage(t *testing.T) {
	path := os.Getenv("CAPSNAP_IMAGE")
	if path == "" {
		t.Skip("CAPSNAP_IMAGE is not set: make image-test builds the image and sets it")
	}
	img, _ := readArchive(t, path)
	binary := checkImage(t, img)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	labels := cf.Config.Labels

	bin := filepath.Join(t.TempDir(), "capsnap")
	if err := os.WriteFile(bin, binary, 0o755); err != nil {
		t.Fatal(err)
	}
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatalf("/capsnap: %v", err)
	}
	p, err := checkBuild(bi)
	if err != nil {
		t.Fatalf("/capsnap: %v", err)
	}
	if p.Architecture != cf.Architecture || cf.OS != "linux" {
		t.Errorf("/capsnap is for %s/%s, the image says %s/%s", p.OS, p.Architecture, cf.OS, cf.Architecture)
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && s.Value != labels["org.opencontainers.image.revision"] {
			t.Errorf("/capsnap was built from %s, the image says %s", s.Value, labels["org.opencontainers.image.revision"])
		}
	}

	if p.Architecture != runtime.GOARCH || runtime.GOOS != "linux" {
		t.Skipf("the image is for linux/%s and this is %s/%s: /capsnap not run", p.Architecture, runtime.GOOS, runtime.GOARCH)
	}
	out := runCapsnap(t, bin, "version")
	if want := "capsnap " + labels["org.opencontainers.image.version"]; !strings.HasPrefix(out, want+"\n") && !strings.HasPrefix(out, want+" ") {
		t.Errorf("capsnap version printed %q, want it to start with %q, the image's version", out, want)
	}
	if out := runCapsnap(t, bin, "--help"); !strings.Contains(out, "serve") {
		t.Errorf("capsnap --help does not list serve:\n%s", out)
	}
	if out := runCapsnap(t, bin, append(slices.Clone(cf.Config.Cmd), "--help")...); !strings.Contains(out, "--config") {
		t.Errorf("capsnap %s --help does not take --config:\n%s", strings.Join(cf.Config.Cmd, " "), out)
	}
}

func runCapsnap(t *testing.T, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("capsnap %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// checkImage checks what every capsnap image must be: OCI media types, the
// runtime configuration its labels call for, the labels in the manifest
// too, and one layer holding capsnap and the CA certificates only, all
// root's and read-only. It returns /capsnap.
func checkImage(t *testing.T, img v1.Image) []byte {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != types.OCIManifestSchema1 || m.Config.MediaType != types.OCIConfigJSON {
		t.Errorf("media types %s, %s; want an OCI manifest and config", m.MediaType, m.Config.MediaType)
	}
	if len(m.Layers) != 1 || m.Layers[0].MediaType != types.OCILayer {
		t.Fatalf("layers %+v; want one %s", m.Layers, types.OCILayer)
	}

	labels := cf.Config.Labels
	created, err := time.Parse(time.RFC3339, labels["org.opencontainers.image.created"])
	if err != nil {
		t.Errorf("label org.opencontainers.image.created: %v", err)
	}
	s := spec{
		version:  labels["org.opencontainers.image.version"],
		revision: labels["org.opencontainers.image.revision"],
		source:   labels["org.opencontainers.image.source"],
		created:  created,
	}
	if err := s.validate(); err != nil {
		t.Errorf("labels %v: %v", labels, err)
	}
	if !cf.Created.Equal(created) {
		t.Errorf("created %s, label %s", cf.Created, created)
	}
	if !reflect.DeepEqual(cf.Config, s.runtimeConfig()) {
		t.Errorf("config %+v\nwant %+v", cf.Config, s.runtimeConfig())
	}
	if !reflect.DeepEqual(m.Annotations, labels) {
		t.Errorf("manifest annotations %v, want the labels %v", m.Annotations, labels)
	}
	if uid, _, _ := strings.Cut(cf.Config.User, ":"); uid == "" || uid == "0" || strings.Trim(uid, "0123456789") != "" {
		t.Errorf("user %q: want a numeric uid other than root's", cf.Config.User)
	}

	layer, err := img.LayerByDigest(m.Layers[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := layer.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	files := map[string][]byte{}
	var names []string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s belongs to %d:%d, want root, so that capsnap cannot change it", h.Name, h.Uid, h.Gid)
		}
		if h.Mode&0o222 != 0 && h.Typeflag != tar.TypeDir {
			t.Errorf("%s is writable (%o)", h.Name, h.Mode)
		}
		if !h.ModTime.Equal(created) {
			t.Errorf("%s has time %s, want the image's %s", h.Name, h.ModTime, created)
		}
		if files[h.Name], err = io.ReadAll(tr); err != nil {
			t.Fatal(err)
		}
	}
	// No shell, no libc, no package manager: these and nothing else.
	want := []string{binaryPath, "etc/", "etc/ssl/", "etc/ssl/certs/", caBundlePath}
	if !slices.Equal(names, want) {
		t.Errorf("layer holds %q, want exactly %q", names, want)
	}
	if !slices.Contains(cf.Config.Entrypoint, "/"+binaryPath) {
		t.Errorf("entrypoint %q does not run /%s", cf.Config.Entrypoint, binaryPath)
	}

	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(files[caBundlePath]) || len(bytes.Split(files[caBundlePath], []byte("BEGIN CERTIFICATE"))) < 100 {
		t.Errorf("%s does not hold the root store (%d bytes)", caBundlePath, len(files[caBundlePath]))
	}
	return files[binaryPath]
}

// readArchive reads an OCI layout archive as skopeo would: its one image,
// and the descriptor index.json has for it.
func readArchive(t *testing.T, path string) (v1.Image, v1.Descriptor) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dir := t.TempDir()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if !filepath.IsLocal(h.Name) {
			t.Fatalf("%s: entry %q leaves the archive", path, h.Name)
		}
		p := filepath.Join(dir, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeReg:
			var data []byte
			if data, err = io.ReadAll(tr); err == nil {
				err = os.WriteFile(p, data, 0o644)
			}
		default:
			t.Fatalf("%s: entry %q is neither a file nor a directory", path, h.Name)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("%s: %d manifests, want one image", path, len(im.Manifests))
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img, im.Manifests[0]
}
