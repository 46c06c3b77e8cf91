// Package charts has no code of its own. Its tests hold the Helm chart,
// charts/capsnap, to what Helm, Kubernetes and capsnap accept: helm lint and
// helm template on each values file in testdata, every rendered object
// decoded strictly into its Kubernetes (or Prometheus Operator) API type,
// the capsnap.yaml and policy it renders accepted by capsnap's own parsers,
// every file capsnap.yaml names mounted from the Secret it should come from
// (the approvers' files the chart renders loaded as capsnap loads them),
// selectors that select, the approval listener's ports, Ingress and base
// URL, and the reload of the configuration and the policy.
//
// The tests that run Helm need it at $CAPSNAP_HELM, which make chart-test
// builds and sets; plain go test skips them.
package charts
