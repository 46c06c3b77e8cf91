package decide

import (
	"path/filepath"
	"testing"

	"github.com/capsnap/capsnap/envelope"
)

// BenchmarkCheckEnvelope is BenchmarkCheckAllowed without and with the
// signed envelope: what an allowed call's envelope costs in process. The
// Ed25519 signature is most of it; the claims and the arguments' canonical
// digest are the rest.
func BenchmarkCheckEnvelope(b *testing.B) {
	keys, err := envelope.LoadKeys(filepath.Join("..", "envelope", "testdata", "key-a.pem"))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("off", func(b *testing.B) { benchmarkAllowed(b, packFixture(b, discardAudit)) })
	b.Run("on", func(b *testing.B) {
		benchmarkAllowed(b, packFixture(b, discardAudit, func(o *Options) { o.Envelope = keys }))
	})
	r, err := envelope.LoadRecipient(filepath.Join("..", "envelope", "testdata", "grant-key-a.pub.pem"))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("grant", func(b *testing.B) {
		benchmarkAllowed(b, packFixture(b, discardAudit, func(o *Options) {
			o.Envelope, o.Grants = keys, map[string]*envelope.Recipient{"billing": r}
		}))
	})
}
