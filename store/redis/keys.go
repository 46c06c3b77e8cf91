package redis

import (
	"strconv"
	"strings"
)

// Layout names the keys a store writes under its prefix. Every key carries
// a Redis Cluster hash tag ({...}), chosen so that the keys one operation
// touches together land in one slot:
//
//   - a snapshot and the calls recorded under it (the sequence rules'
//     script reads both): tagged with the epoch;
//   - a principal's newest-snapshot pointers on a server, per session and
//     in any session (written together): tagged with (principal, server);
//   - the invalidation sequence and the changed tools (the compare-and-set
//     script writes both): tagged "inv", one slot for the whole store;
//   - a listing ticket's redemption: tagged with the ticket.
//
// The tag is length-prefixed, so it is never empty, and the keys of one
// operation read alike from their '{' to the first '}' after it, whatever
// a principal or an epoch holds: one slot, whatever Redis makes of the tag.
// The prefix itself may hold no brace (Open refuses one), or it would be
// the tag. On one Redis the tags are only part of the name.
type Layout struct{ Prefix string }

// key is prefix, kind, the tag and the rest: kind names what the key
// holds; the length-prefixed tag picks its slot.
func (l Layout) key(kind, tag, rest string) string {
	var b strings.Builder
	b.Grow(len(l.Prefix) + len(kind) + len(tag) + len(rest) + 16)
	b.WriteString(l.Prefix)
	b.WriteString(kind)
	b.WriteString(":{")
	b.WriteString(strconv.Itoa(len(tag)))
	b.WriteByte(':')
	b.WriteString(tag)
	b.WriteByte('}')
	b.WriteString(rest)
	return b.String()
}

// invTag is the one slot of the invalidations.
const invTag = "inv"

// Seq is the key of the invalidation sequence.
func (l Layout) Seq() string { return l.key("seq", invTag, "") }

// Invalidations is the key of the hash of changed tools.
func (l Layout) Invalidations() string { return l.key("inv", invTag, "") }

// Snapshot is the key of the snapshot with that epoch.
func (l Layout) Snapshot(epoch string) string { return l.key("snap", epoch, "") }

// Calls is the key of the calls recorded under the snapshot with that
// epoch.
func (l Layout) Calls(epoch string) string { return l.key("calls", epoch, "") }

// Latest is the key of the newest-snapshot pointer of (principal, server,
// session). The tag is self-delimiting (length-prefixed), so the session
// after it makes the key unambiguous.
func (l Layout) Latest(principal, serverID, session string) string {
	return l.pointerKey("latest", principal, serverID, session)
}

// AnySession is the key of the newest-snapshot pointer of (principal,
// server) in any session.
func (l Layout) AnySession(principal, serverID string) string {
	return l.pointerKey("any", principal, serverID, "")
}

// pointerKey is key(kind, store.AnySessionKey(principal, serverID), rest)
// made in one allocation: every tools/call reads a pointer.
func (l Layout) pointerKey(kind, principal, serverID, rest string) string {
	var pn, sn, tn [20]byte
	p := strconv.AppendInt(pn[:0], int64(len(principal)), 10)
	s := strconv.AppendInt(sn[:0], int64(len(serverID)), 10)
	tagLen := len(p) + 1 + len(principal) + len(s) + 1 + len(serverID)
	t := strconv.AppendInt(tn[:0], int64(tagLen), 10)
	var b strings.Builder
	b.Grow(len(l.Prefix) + len(kind) + 2 + len(t) + 1 + tagLen + 1 + len(rest))
	b.WriteString(l.Prefix)
	b.WriteString(kind)
	b.WriteString(":{")
	b.Write(t)
	b.WriteByte(':')
	b.Write(p)
	b.WriteByte(':')
	b.WriteString(principal)
	b.Write(s)
	b.WriteByte(':')
	b.WriteString(serverID)
	b.WriteByte('}')
	b.WriteString(rest)
	return b.String()
}

// Redeemed is the key of a listing ticket's redemption.
func (l Layout) Redeemed(ticket string) string { return l.key("redeemed", ticket, "") }

// Counter is the key of a budget's or rate limit's counter, by its
// hashed name: one key per script.
func (l Layout) Counter(hashed string) string { return l.key("counter", hashed, "") }

// Loosening is the key of the acceptance of a looser policy, by the
// source it accepts: changed alone, so it needs no shared slot.
func (l Layout) Loosening(source string) string { return l.key("loosening", source, "") }

// ApprovalRequest, ApprovalBinding and ApprovalIndex are the keys of an
// approval request, of the pointer from a binding to its live request, and
// of the index of every request: each changed alone (a compare-and-set of
// one key), so no two need one slot.
func (l Layout) ApprovalRequest(id string) string { return l.key("approval-req", id, "") }

func (l Layout) ApprovalBinding(key string) string { return l.key("approval-binding", key, "") }

func (l Layout) ApprovalIndex() string { return l.key("approval-index", "index", "") }

// Definition is the key of a tool's approved and rejected definitions,
// tagged with the server (length-prefixed) and the tool, so that no
// choice of names makes two tools one key.
func (l Layout) Definition(serverID, tool string) string {
	return l.key("def", strconv.Itoa(len(serverID))+":"+serverID+tool, "")
}
