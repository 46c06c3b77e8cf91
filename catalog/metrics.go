package catalog

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"
)

var posInf = math.Inf(1)

// NoteListChanged counts a notifications/tools/list_changed from serverID.
func (c *Catalog) NoteListChanged(serverID string) {
	if s, ok := c.servers[serverID]; ok {
		s.listChanged.Add(1)
	}
}

var (
	toolsDesc = prometheus.NewDesc("capsnap_catalog_tools",
		"Tools in capsnap's current view of each server.", []string{"server_id"}, nil)
	refreshesDesc = prometheus.NewDesc("capsnap_catalog_refreshes_total",
		"Catalog refreshes (tools/list or file reads) by result: ok or error.", []string{"server_id", "result"}, nil)
	listChangedDesc = prometheus.NewDesc("capsnap_catalog_list_changed_total",
		"notifications/tools/list_changed received from each server.", []string{"server_id"}, nil)
	stalenessDesc = prometheus.NewDesc("capsnap_catalog_staleness_seconds",
		"Seconds since each server's catalog was last confirmed; +Inf if never.", []string{"server_id"}, nil)
)

// Describe implements prometheus.Collector.
func (c *Catalog) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{toolsDesc, refreshesDesc, listChangedDesc, stalenessDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector, reading each server's state at
// scrape time so that staleness is exact. server_id values come from the
// configuration, so the label set is bounded.
func (c *Catalog) Collect(ch chan<- prometheus.Metric) {
	now := c.opts.Clock()
	for id, s := range c.servers {
		st := s.state.Load()
		tools, stale := 0.0, posInf
		if st.list != nil {
			tools = float64(len(st.list.Tools))
			stale = now.Sub(st.status.FetchedAt).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(toolsDesc, prometheus.GaugeValue, tools, id)
		ch <- prometheus.MustNewConstMetric(stalenessDesc, prometheus.GaugeValue, stale, id)
		ch <- prometheus.MustNewConstMetric(refreshesDesc, prometheus.CounterValue, float64(s.refreshOK.Load()), id, "ok")
		ch <- prometheus.MustNewConstMetric(refreshesDesc, prometheus.CounterValue, float64(s.refreshErr.Load()), id, "error")
		ch <- prometheus.MustNewConstMetric(listChangedDesc, prometheus.CounterValue, float64(s.listChanged.Load()), id)
	}
}

var _ prometheus.Collector = (*Catalog)(nil)
