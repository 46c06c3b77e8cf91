package approval

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// Client speaks the approval listener's JSON API as one approver, for
// `capsnap approvals`.
type Client struct {
	// URL is the approval listener's base URL.
	URL string
	// Token is the approver's bearer token.
	Token string
	HTTP  *http.Client
}

// List returns the requests f selects that the approver may decide,
// newest first.
func (c *Client) List(ctx context.Context, f Filter) ([]View, error) {
	q := url.Values{}
	if f.State != "" {
		q.Set("state", string(f.State))
	}
	if f.Principal != "" {
		q.Set("principal", f.Principal)
	}
	path := "/api/approvals"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out struct {
		Approvals []View `json:"approvals"`
	}
	return out.Approvals, c.do(ctx, http.MethodGet, path, nil, &out)
}

// Get returns request id.
func (c *Client) Get(ctx context.Context, id string) (View, error) {
	var v View
	return v, c.do(ctx, http.MethodGet, "/api/approvals/"+url.PathEscape(id), nil, &v)
}

// Decide approves or denies request id, saying why.
func (c *Client) Decide(ctx context.Context, id string, approve bool, reason string) (View, error) {
	action := "deny"
	if approve {
		action = "approve"
	}
	body, err := json.Marshal(DecideBody{Reason: reason})
	if err != nil {
		return View{}, err
	}
	var v View
	return v, c.do(ctx, http.MethodPost, "/api/approvals/"+url.PathEscape(id)+"/"+action, body, &v)
}

// do calls the API; a refusal is an *APIError.
func (c *Client) do(ctx context.Context, method, path string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(c.URL, "/")+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("approvals: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("approvals: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("approvals: %s %s: %w", method, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error APIError `json:"error"`
		}
		if json.Unmarshal(data, &e) != nil || e.Error.Code == "" {
			return fmt.Errorf("approvals: %s %s: %s", method, path, resp.Status)
		}
		e.Error.Status = resp.StatusCode
		return &e.Error
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("approvals: %s %s: %w", method, path, err)
	}
	return nil
}
