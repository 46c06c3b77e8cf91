package main

import (
	"archive/tar"
	"bytes"
	"crypto/x509"
	"debug/buildinfo"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// capsnapPackage is the main package the image's binary must be built from.
const capsnapPackage = "github.com/capsnap/capsnap/cmd/capsnap"

// Paths in the image, as the tar archive of its layer names them.
const (
	binaryPath   = "capsnap"
	caBundlePath = "etc/ssl/certs/ca-certificates.crt"
)

// spec is what the image says about where it comes from: its OCI labels,
// and the manifest's annotations of the same names.
type spec struct {
	version  string
	revision string
	source   string
	// created is the time of every file in the layer and of the image:
	// the commit's, so that one commit gives one image, whenever built.
	created time.Time
}

func (s spec) validate() error {
	for name, v := range map[string]string{"version": s.version, "revision": s.revision, "source": s.source} {
		if strings.TrimSpace(v) == "" {
			return fmt.Errorf("spec: no %s", name)
		}
	}
	return nil
}

// labels are the image's OCI labels (the pre-defined annotation keys of the
// OCI image spec), which registries and scanners read to link an image to
// its source and commit.
func (s spec) labels() map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "capsnap",
		"org.opencontainers.image.description": "Envoy ext_authz server that binds MCP tool calls to the capability snapshot the agent was authorized against",
		"org.opencontainers.image.source":      s.source,
		"org.opencontainers.image.version":     s.version,
		"org.opencontainers.image.revision":    s.revision,
		"org.opencontainers.image.created":     s.created.UTC().Format(time.RFC3339),
	}
}

// runtimeConfig is how the image runs capsnap: what the Dockerfile's final
// stage says, which examples/deploy compares with testdata/config.golden.json.
func (s spec) runtimeConfig() v1.Config {
	return v1.Config{
		// Numeric, so that the kubelet can verify runAsNonRoot; 65532 is
		// distroless's nonroot, the Dockerfile's user. With the group given
		// too, the runtime looks up neither, and the image needs no
		// /etc/passwd: capsnap resolves no user.
		User:       "65532:65532",
		Entrypoint: []string{"/" + binaryPath},
		Cmd:        []string{"serve", "--config", "/etc/capsnap/capsnap.yaml"},
		// 9001: ext_authz, ext_proc and grpc.health.v1. 9002: /healthz,
		// /readyz, /metrics, /catalog and POST /policy/reload.
		ExposedPorts: map[string]struct{}{"9001/tcp": {}, "9002/tcp": {}},
		WorkingDir:   "/",
		Labels:       s.labels(),
	}
}

// checkBuild refuses a binary that would not run, or should not ship, in
// an image with nothing else in it; it returns the platform the binary is
// for. Static (CGO_ENABLED=0): the image has no libc and no dynamic loader.
// -trimpath: the binary carries no path of the build machine.
func checkBuild(bi *buildinfo.BuildInfo) (v1.Platform, error) {
	if bi.Path != capsnapPackage {
		return v1.Platform{}, fmt.Errorf("binary: built from %s, want %s", bi.Path, capsnapPackage)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	var errs []error
	if settings["GOOS"] != "linux" {
		errs = append(errs, fmt.Errorf("binary: GOOS=%s, want linux", settings["GOOS"]))
	}
	if settings["GOARCH"] == "" {
		errs = append(errs, errors.New("binary: no GOARCH in its build information"))
	}
	if settings["CGO_ENABLED"] != "0" {
		errs = append(errs, errors.New("binary: built with cgo; build it with CGO_ENABLED=0, the image has no libc"))
	}
	if settings["-trimpath"] != "true" {
		errs = append(errs, errors.New("binary: built without -trimpath"))
	}
	if err := errors.Join(errs...); err != nil {
		return v1.Platform{}, err
	}
	return v1.Platform{OS: "linux", Architecture: settings["GOARCH"]}, nil
}

// caBundle is the Mozilla root store as golang.org/x/crypto/x509roots
// carries it, in PEM: what capsnap verifies an https MCP server's
// certificate against. From a module pinned in go.sum rather than the
// build machine's /etc/ssl, so that the image does not depend on where it
// is built. Roots the store constrains (a distrust-after date) are left
// out: a PEM file cannot say the constraint, and without it they would be
// trusted for more than Go's own fallback trusts them for.
func caBundle() ([]byte, error) {
	var buf bytes.Buffer
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue
		}
		if _, err := x509.ParseCertificate(r.Certificate); err != nil {
			return nil, fmt.Errorf("ca bundle: %w", err)
		}
		if err := pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate}); err != nil {
			return nil, fmt.Errorf("ca bundle: %w", err)
		}
	}
	if buf.Len() == 0 {
		return nil, errors.New("ca bundle: no roots")
	}
	return buf.Bytes(), nil
}

// file is one entry of a tar archive; a name that ends in "/" is a
// directory.
type file struct {
	name string
	mode int64
	data []byte
}

// layerFiles are the whole of the image's file system: capsnap and the CA
// certificates. No shell, no package manager, no libc, nothing writable:
// every file is root's, and capsnap (65532) can only read and run them,
// so the image runs on a read-only root file system as it is.
func layerFiles(binary, certs []byte) []file {
	return []file{
		{name: binaryPath, mode: 0o555, data: binary},
		{name: "etc/", mode: 0o755},
		{name: "etc/ssl/", mode: 0o755},
		{name: "etc/ssl/certs/", mode: 0o755},
		{name: caBundlePath, mode: 0o444, data: certs},
	}
}

// writeTar writes files to w as a tar archive, in their order, with no
// owner but root and every time the given one, so that the same files give
// the same bytes.
func writeTar(w io.Writer, files []file, mtime time.Time) error {
	tw := tar.NewWriter(w)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, ModTime: mtime, Typeflag: tar.TypeReg, Size: int64(len(f.data))}
		if strings.HasSuffix(f.name, "/") {
			h.Typeflag = tar.TypeDir
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("tar: %s: %w", f.name, err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return fmt.Errorf("tar: %s: %w", f.name, err)
		}
	}
	return tw.Close()
}

// build is the image: one layer on nothing, with OCI media types throughout.
func build(s spec, p v1.Platform, binary []byte) (v1.Image, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	certs, err := caBundle()
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := writeTar(&buf, layerFiles(binary, certs), s.created); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	data := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	created := v1.Time{Time: s.created.UTC()}
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: created, CreatedBy: "make image", Comment: "capsnap and the CA certificates"},
	})
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Created = created
	cf.Config = s.runtimeConfig()
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	// The manifest carries the labels too: registries (GHCR among them)
	// read the source and the revision from its annotations.
	return mutate.Annotations(img, s.labels()).(v1.Image), nil
}
