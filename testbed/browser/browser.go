// Package browser starts a headless Chromium for a test and keeps its
// screenshots: the approval page's tests, in package approval and end to
// end, drive Debian's chromium with chromedp.
package browser

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Browser is a headless Chromium a test drives with chromedp, and where
// its screenshots are kept.
type Browser struct {
	Ctx   context.Context
	shots string
}

// The environment the browser tests read: the Chromium binary (make unit
// and make e2e install Debian's chromium and set it), and the directory
// screenshots are kept in (a test's temporary directory if unset).
const (
	ChromiumEnv  = "CAPSNAP_CHROMIUM"
	ArtifactsEnv = "CAPSNAP_ARTIFACTS"
)

// Start starts Chromium for t, its screenshots kept under
// $CAPSNAP_ARTIFACTS/name, with 90 seconds for everything it does. With
// $CAPSNAP_CHROMIUM unset it skips t when required is false and fails it
// otherwise; set to a binary that is not there, it fails t.
func Start(t testing.TB, name string, required bool) *Browser {
	t.Helper()
	bin := os.Getenv(ChromiumEnv)
	if bin == "" && !required {
		t.Skipf("$%s is unset: this test needs a real Chromium (make unit and make e2e install and set it)", ChromiumEnv)
	}
	if _, err := exec.LookPath(bin); bin == "" || err != nil {
		t.Fatalf("$%s=%q: %v; make unit and make e2e install Debian's chromium and set it", ChromiumEnv, bin, err)
	}
	shots := t.TempDir()
	if dir := os.Getenv(ArtifactsEnv); dir != "" {
		shots = filepath.Join(dir, name)
		if err := os.MkdirAll(shots, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1000, 1100))...)
	ctx, cancelCtx := chromedp.NewContext(alloc, chromedp.WithLogf(t.Logf))
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() { cancel(); cancelCtx(); cancelAlloc() })
	return &Browser{Ctx: ctx, shots: shots}
}

// Screenshot keeps the whole page as name (a .png) among the screenshots.
func (b *Browser) Screenshot(t testing.TB, name string) {
	t.Helper()
	png, err := chromedp.Run(b.Ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(b.shots, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s", path)
}
