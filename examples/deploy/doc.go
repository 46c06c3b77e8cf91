// Package deploy has no code of its own. Its tests hold the deployment
// examples to what capsnap really is: the Kubernetes manifests, the Istio
// configuration, the Prometheus scrape job and alert rules, the Grafana
// dashboard, the Dockerfile and its .dockerignore.
//
// Each test checks what a typo or a drift would silently break in a real
// deployment: that the files parse, that capsnap accepts the configuration
// and policy the ConfigMap ships, that ports, paths and names agree from one
// file to the next, that every secret comes from a Secret capsnap can read,
// that only the MCP servers' Envoys may call capsnap (the same identities
// in grpc_tls and in Istio's policy, over mutual TLS), that Istio's CUSTOM policy, the server_id patch and the
// response-path patch cover the same workloads (and that patch's filter is
// envoy/demo.yaml's), that every metric the alerts and the dashboard query
// is one capsnap exports, and that the image is static and non-root.
package deploy
