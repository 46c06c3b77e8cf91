package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/spf13/cobra"

	"github.com/capsnap/capsnap/config"
)

// adminOptions say which running capsnap a command asks, on its admin
// listener: with config, capsnap's own configuration says where
// (admin_addr, on loopback if it listens on every interface) and with
// which token (admin.token_file); admin and tokenFile, when given,
// override it.
type adminOptions struct {
	admin, tokenFile, config string
}

// adminFlags adds the flags of a command that asks the admin listener.
func adminFlags(c *cobra.Command, o *adminOptions) {
	c.Flags().StringVar(&o.admin, "admin", "", "capsnap's admin_addr (default: --config's, else "+config.Default().AdminAddr+")")
	c.Flags().StringVar(&o.tokenFile, "token-file", "", "the file holding capsnap's admin token (default: --config's admin.token_file)")
	c.Flags().StringVar(&o.config, "config", "", "capsnap's configuration file, for admin_addr and admin.token_file")
}

// adminRefusal is the admin listener's answer to a request it did not do:
// its result (unauthorized, bad_request, refused_loosening, ...) and why.
type adminRefusal struct {
	Result string `json:"result"`
	Why    string `json:"error"`
}

func (e *adminRefusal) Error() string { return e.Result + ": " + e.Why }

// ask sends method path?query to the admin listener and decodes its JSON
// answer into out. An answer that is not a 2xx, or that says it failed,
// is an *adminRefusal after cmd (like "policy reload"), which starts
// every error.
func (o adminOptions) ask(cmd, method, path string, query url.Values, out any) error {
	if o.config != "" {
		cfg, err := config.Load(o.config)
		if err != nil {
			return err
		}
		if o.admin == "" {
			o.admin = loopbackIfUnspecified(cfg.AdminAddr)
		}
		if o.tokenFile == "" {
			o.tokenFile = cfg.Admin.TokenFile
		}
	}
	if o.admin == "" {
		o.admin = config.Default().AdminAddr
	}
	u := url.URL{Scheme: "http", Host: o.admin, Path: path, RawQuery: query.Encode()}
	req, err := http.NewRequest(method, u.String(), nil)
	if err != nil {
		return usageError{fmt.Sprintf("%s: --admin %q: %v", cmd, o.admin, err)}
	}
	if o.tokenFile != "" {
		tok, err := config.Admin{TokenFile: o.tokenFile}.ReadToken()
		if err != nil {
			return fmt.Errorf("%s: %w", cmd, err)
		}
		req.Header.Set("Authorization", "Bearer "+string(tok))
	}
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("%s: %s: %w", cmd, resp.Status, err)
	}
	var refused adminRefusal
	if err := json.Unmarshal(body, &refused); err != nil {
		return fmt.Errorf("%s: %s: %w", cmd, resp.Status, err)
	}
	if resp.StatusCode/100 != 2 || refused.Why != "" {
		if refused.Result == "" {
			refused.Result = resp.Status
		}
		return fmt.Errorf("%s %w", cmd, &refused)
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	return nil
}
