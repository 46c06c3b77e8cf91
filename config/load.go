package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"

	"go.yaml.in/yaml/v3"

	"github.com/capsnap/capsnap/internal/yamlkeys"
)

// Reading a file: strict decoding over the defaults, then Validate.

// Load reads, decodes and validates a configuration file. Relative paths in
// it are taken relative to the file's directory.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("load config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return Config{}, fmt.Errorf("load config %s: %w", path, err)
	}
	c.resolvePaths(filepath.Dir(path))
	return c, nil
}

// Parse decodes a configuration over the defaults, rejecting unknown keys,
// and validates it.
func Parse(data []byte) (Config, error) {
	c := Default()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("decode: %w", yamlkeys.Explain(err, reflect.TypeFor[Config]()))
	}
	if err := dec.Decode(new(any)); !errors.Is(err, io.EOF) {
		return Config{}, errors.New("decode: more than one YAML document")
	}
	for i := range c.Servers {
		if c.Servers[i].Resync == 0 {
			c.Servers[i].Resync = defaultResync
		}
		if c.Servers[i].ProtocolVersion == "" && c.Servers[i].URL != "" {
			c.Servers[i].ProtocolVersion = defaultProtocol
		}
		if c.Servers[i].ClientCapabilities == nil && c.Servers[i].URL != "" {
			c.Servers[i].ClientCapabilities = slices.Clone(ClientCapabilityNames)
		}
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func (c *Config) resolvePaths(dir string) {
	abs := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	c.PolicyFile = abs(c.PolicyFile)
	c.Audit.Path = abs(c.Audit.Path)
	for i := range c.Envelope.KeyFiles {
		c.Envelope.KeyFiles[i] = abs(c.Envelope.KeyFiles[i])
	}
	r := &c.Snapshots.Redis
	r.SecretFile, r.PasswordFile, r.Sentinel.PasswordFile = abs(r.SecretFile), abs(r.PasswordFile), abs(r.Sentinel.PasswordFile)
	r.TLS.CAFile, r.TLS.CertFile, r.TLS.KeyFile = abs(r.TLS.CAFile), abs(r.TLS.CertFile), abs(r.TLS.KeyFile)
	for i := range c.Servers {
		c.Servers[i].CatalogFile = abs(c.Servers[i].CatalogFile)
		c.Servers[i].GrantKeyFile = abs(c.Servers[i].GrantKeyFile)
	}
	c.resolveAccessPaths(abs)
	a := &c.Approvals.Auth
	a.JWKSFile, a.DevTokensFile = abs(a.JWKSFile), abs(a.DevTokensFile)
}
