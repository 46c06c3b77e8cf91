// Command image builds capsnap's container image without a container
// engine: an OCI image of one layer on nothing, holding the static capsnap
// binary and the CA certificates, run as uid 65532, written as an OCI image
// layout in a tar archive. `make image` builds the binary and runs it:
//
//	go run ./deploy/image -binary bin/linux_amd64/capsnap -version v0.1.0 \
//	    -revision "$(git rev-parse HEAD)" -source https://github.com/capsnap/capsnap \
//	    -created "$(git log -1 --format=%ct)" -out bin/capsnap-image.tar
//
// It is go-containerregistry's pkg/v1 rather than ko because ko puts the
// binary under /ko-app and fetches a base image, where this image is
// /capsnap on an empty base, built with no network. The Dockerfile builds
// one like it with Docker, on distroless (examples/deploy holds the two to
// one user, entrypoint, command and ports).
package main

import (
	"debug/buildinfo"
	"flag"
	"fmt"
	"io"
	"os"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	fs.SetOutput(stderr)
	binary := fs.String("binary", "", "the capsnap binary: built for linux with CGO_ENABLED=0 and -trimpath")
	out := fs.String("out", "", "the archive to write (an OCI image layout in tar)")
	var s spec
	fs.StringVar(&s.version, "version", "", "org.opencontainers.image.version, and the tag in the archive")
	fs.StringVar(&s.revision, "revision", "", "org.opencontainers.image.revision: the commit")
	fs.StringVar(&s.source, "source", "", "org.opencontainers.image.source: the repository's URL")
	created := fs.Int64("created", 0, "the image's time in seconds since 1970 (SOURCE_DATE_EPOCH): the commit's, for a reproducible image")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *binary == "" || *out == "" || fs.NArg() != 0 {
		fs.Usage()
		return fmt.Errorf("usage: -binary and -out are required, and nothing else")
	}
	s.created = time.Unix(*created, 0).UTC()

	bi, err := buildinfo.ReadFile(*binary)
	if err != nil {
		return fmt.Errorf("binary: %w", err)
	}
	p, err := checkBuild(bi)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(*binary)
	if err != nil {
		return fmt.Errorf("binary: %w", err)
	}
	img, err := build(s, p, data)
	if err != nil {
		return err
	}
	if err := writeArchive(*out, img, s, p); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	fmt.Fprintf(stderr, "%s: capsnap %s for %s/%s, %s\n", *out, s.version, p.OS, p.Architecture, digest)
	return nil
}
