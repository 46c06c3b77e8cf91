package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// refNameAnnotation names an image in an OCI layout's index.json: the tag
// `skopeo copy oci-archive:FILE:TAG` selects, and the one it gives an image
// it copies from the archive without a tag.
const refNameAnnotation = "org.opencontainers.image.ref.name"

// writeArchive writes img to out as an OCI image layout in a tar archive,
// what skopeo and podman call an oci-archive, and containerd (ctr import,
// kind load image-archive) imports. The layout comes from
// go-containerregistry; the archive is written here, every entry with the
// image's time and no owner, so that one image gives one archive.
func writeArchive(out string, img v1.Image, s spec, p v1.Platform) (err error) {
	dir, err := os.MkdirTemp("", "capsnap-image-")
	if err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{refNameAnnotation: s.version}), layout.WithPlatform(p)); err != nil {
		return fmt.Errorf("archive: %w", err)
	}

	f, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("archive: %w", cerr)
		}
	}()
	files, err := layoutFiles(dir)
	if err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	if err := writeTar(f, files, s.created); err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	return nil
}

// layoutFiles reads the tree under dir, in lexical order.
func layoutFiles(dir string) ([]file, error) {
	var files []file
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			files = append(files, file{name: filepath.ToSlash(rel) + "/", mode: 0o755})
			return nil
		}
		data, err := os.ReadFile(path)
		files = append(files, file{name: filepath.ToSlash(rel), mode: 0o644, data: data})
		return err
	})
	return files, err
}
