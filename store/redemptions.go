package store

import "time"

// redemptions are the listing tickets a Memory store holds as redeemed,
// each until its keep runs out. A single replica redeems only its own
// tickets and watches them itself; the memory store keeps them anyway,
// so that it is a Backend whole, as the Redis store is.
type redemptions struct {
	until map[string]time.Time
}

// Redeem implements Redemptions.
func (m *Memory) Redeem(tickets []string, keep time.Duration) error {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.redeemed.until == nil {
		m.redeemed.until = map[string]time.Time{}
	}
	// What has run out goes first, so that the map holds what is kept.
	for t, until := range m.redeemed.until {
		if !now.Before(until) {
			delete(m.redeemed.until, t)
		}
	}
	for _, t := range tickets {
		m.redeemed.until[t] = now.Add(keep)
	}
	return nil
}

// Redeemed implements Redemptions.
func (m *Memory) Redeemed(tickets []string) ([]bool, error) {
	now := m.now()
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]bool, len(tickets))
	for i, t := range tickets {
		until, ok := m.redeemed.until[t]
		out[i] = ok && now.Before(until)
	}
	return out, nil
}
