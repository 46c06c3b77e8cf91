{{/*
The name of the release's objects: the release name when it says capsnap,
else "<release>-capsnap".
*/}}
{{- define "capsnap.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "capsnap" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-capsnap" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
The name label is always "capsnap": the ServiceMonitor makes it the job
label, and the alert rules select job="capsnap".
*/}}
{{- define "capsnap.selectorLabels" -}}
app.kubernetes.io/name: capsnap
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "capsnap.commonLabels" -}}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "capsnap.labels" -}}
{{ include "capsnap.selectorLabels" . }}
app.kubernetes.io/component: ext-authz
{{ include "capsnap.commonLabels" . }}
{{- end -}}

{{- define "capsnap.redis.selectorLabels" -}}
app.kubernetes.io/name: capsnap-redis
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "capsnap.redis.labels" -}}
{{ include "capsnap.redis.selectorLabels" . }}
app.kubernetes.io/component: snapshot-store
{{ include "capsnap.commonLabels" . }}
{{- end -}}

{{/* An image reference: by digest when there is one, else by tag. */}}
{{- define "capsnap.imageRef" -}}
{{- if .digest -}}
{{- printf "%s@%s" .repository .digest -}}
{{- else -}}
{{- printf "%s:%s" .repository .tag -}}
{{- end -}}
{{- end -}}

{{/* Where the chart mounts what capsnap.yaml names. */}}
{{- define "capsnap.paths" -}}
config: /etc/capsnap
policy: /etc/capsnap-policy
snapshotKey: /var/run/capsnap/snapshot-key
adminToken: /var/run/capsnap/admin-token
tls: /var/run/capsnap/tls
redisPassword: /var/run/capsnap/redis-password
redisTLS: /var/run/capsnap/redis-tls
redisClient: /var/run/capsnap/redis-client
envelope: /var/run/capsnap/envelope
approvers: /var/run/capsnap/approvers
{{- end -}}

{{/*
The approvers' files: the Secret that holds them (the operator's, or the
chart's own made from the inline values) and the key of each it holds,
empty for none.
*/}}
{{- define "capsnap.approvers" -}}
{{- $a := .Values.approvals.auth -}}
{{- $x := $a.existingSecret -}}
{{- if $x.name -}}
secret: {{ $x.name }}
jwksKey: {{ $x.jwksKey | quote }}
devTokensKey: {{ $x.devTokensKey | quote }}
{{- else -}}
secret: {{ include "capsnap.fullname" . }}-approvers
jwksKey: {{ ternary "jwks.json" "" (ne $a.jwks "") | quote }}
devTokensKey: {{ ternary "dev-tokens.yaml" "" (ne $a.devTokens "") | quote }}
{{- end -}}
{{- end -}}

{{/*
Where approvers reach the approval listener: approvals.baseURL, else the
Ingress's host, else the Service's name in the cluster.
*/}}
{{- define "capsnap.approvals.baseURL" -}}
{{- $a := .Values.approvals -}}
{{- if $a.baseURL -}}
{{- trimSuffix "/" $a.baseURL -}}
{{- else if $a.ingress.enabled -}}
{{- printf "%s://%s" (ternary "https" "http" $a.ingress.tls.enabled) $a.ingress.host -}}
{{- else -}}
{{- printf "http://%s.%s.svc.cluster.local:%d" (include "capsnap.fullname" .) .Release.Namespace (int $a.service.port) -}}
{{- end -}}
{{- end -}}

{{/*
capsnap.yaml: .Values.config with what the chart wires itself, which config
must not set. Rendered once into the ConfigMap and once into the checksum
that rolls the pods when it changes.
*/}}
{{- define "capsnap.config" -}}
{{- $v := .Values -}}
{{- $p := include "capsnap.paths" . | fromYaml -}}
{{- $c := deepCopy (default dict $v.config) -}}
{{- range $k := list "grpc_addr" "admin_addr" "grpc_tls" "admin" "policy_file" "servers" -}}
{{- if hasKey $c $k -}}
{{- fail (printf "config.%s is set by the chart; remove it from config (see values.yaml)" $k) -}}
{{- end -}}
{{- end -}}
{{- $snap := default dict (get $c "snapshots") -}}
{{- $redis := default dict (get $snap "redis") -}}
{{- if hasKey $snap "store" -}}
{{- fail "config.snapshots.store is set by the chart from redis.mode; remove it from config" -}}
{{- end -}}
{{- range $k := list "addr" "username" "password_file" "secret_file" "tls" -}}
{{- if hasKey $redis $k -}}
{{- fail (printf "config.snapshots.redis.%s is set by the chart from redis; remove it from config" $k) -}}
{{- end -}}
{{- end -}}
{{- $env := default dict (get $c "envelope") -}}
{{- if hasKey $env "key_files" -}}
{{- fail "config.envelope.key_files is set by the chart from envelope.keys; remove it from config" -}}
{{- end -}}

{{- $_ := set $c "grpc_addr" "0.0.0.0:9001" -}}
{{- $_ := set $c "admin_addr" "0.0.0.0:9002" -}}
{{- $_ := set $c "policy_file" (printf "%s/policy.yaml" $p.policy) -}}
{{- $_ := set $c "servers" $v.servers -}}
{{- $_ := set $c "admin" (dict "token_file" (printf "%s/%s" $p.adminToken $v.adminTokenSecret.key)) -}}
{{- if $v.grpcTLS.enabled -}}
{{- $_ := set $c "grpc_tls" (dict "cert_file" (printf "%s/tls.crt" $p.tls) "key_file" (printf "%s/tls.key" $p.tls) "client_ca_file" (printf "%s/ca.crt" $p.tls) "allowed_clients" $v.grpcTLS.allowedClients) -}}
{{- end -}}

{{- if eq $v.redis.mode "none" -}}
{{- if gt (int $v.replicaCount) 1 -}}
{{- fail "redis.mode none keeps snapshots in each replica's memory: with more than one replica a call that reaches another replica than its tools/list is denied no_snapshot. Use redis.mode bundled or external, or replicaCount 1" -}}
{{- end -}}
{{- $_ := set $snap "store" "memory" -}}
{{- else -}}
{{- $_ := set $snap "store" "redis" -}}
{{- $_ := set $redis "secret_file" (printf "%s/%s" $p.snapshotKey $v.redis.keySecret.key) -}}
{{- if eq $v.redis.mode "bundled" -}}
{{- $_ := set $redis "addr" (printf "%s-redis:6379" (include "capsnap.fullname" .)) -}}
{{- else -}}
{{- $x := $v.redis.external -}}
{{- $_ := set $redis "addr" $x.addr -}}
{{- with $x.username }}{{ $_ := set $redis "username" . }}{{ end -}}
{{- if $x.passwordSecret.name -}}
{{- $_ := set $redis "password_file" (printf "%s/%s" $p.redisPassword $x.passwordSecret.key) -}}
{{- end -}}
{{- if $x.tls.enabled -}}
{{- $tls := dict "ca_file" (printf "%s/%s" $p.redisTLS $x.tls.caSecret.key) -}}
{{- with $x.tls.serverName }}{{ $_ := set $tls "server_name" . }}{{ end -}}
{{- if $x.tls.clientSecret.name -}}
{{- $_ := set $tls "cert_file" (printf "%s/tls.crt" $p.redisClient) -}}
{{- $_ := set $tls "key_file" (printf "%s/tls.key" $p.redisClient) -}}
{{- end -}}
{{- $_ := set $redis "tls" $tls -}}
{{- end -}}
{{- end -}}
{{- $_ := set $snap "redis" $redis -}}
{{- end -}}
{{- $_ := set $c "snapshots" $snap -}}

{{- if $v.envelope.keys -}}
{{- $files := list -}}
{{- range $v.envelope.keys -}}
{{- $files = append $files (printf "%s/%s" $p.envelope .) -}}
{{- end -}}
{{- $_ := set $env "key_files" $files -}}
{{- $_ := set $c "envelope" $env -}}
{{- end -}}

{{- $a := $v.approvals -}}
{{- if not $a.enabled -}}
{{- if hasKey $c "approvals" -}}
{{- fail "config.approvals is set, but approvals.enabled is false: capsnap would serve no approvals; set approvals.enabled" -}}
{{- end -}}
{{- if $a.ingress.enabled -}}
{{- fail "approvals.ingress.enabled is set, but approvals.enabled is false: the Ingress would lead nowhere" -}}
{{- end -}}
{{- else -}}
{{- if has (int $a.port) (list 9001 9002) -}}
{{- fail (printf "approvals.port %d is capsnap's grpc or admin port; choose another" (int $a.port)) -}}
{{- end -}}
{{- $ac := default dict (get $c "approvals") -}}
{{- range $k := list "addr" "base_url" "auth" -}}
{{- if hasKey $ac $k -}}
{{- fail (printf "config.approvals.%s is set by the chart from approvals; remove it from config" $k) -}}
{{- end -}}
{{- end -}}
{{- $au := $a.auth -}}
{{- $x := $au.existingSecret -}}
{{- if and $x.name (or $au.jwks $au.devTokens) -}}
{{- fail "approvals.auth: existingSecret and the inline jwks or devTokens are both set; the approvers' files come from one Secret" -}}
{{- end -}}
{{- if and (not $x.name) (or $x.jwksKey $x.devTokensKey) -}}
{{- fail "approvals.auth.existingSecret: a key is set without the Secret's name" -}}
{{- end -}}
{{- $ap := include "capsnap.approvers" . | fromYaml -}}
{{- $sources := list -}}
{{- if $au.jwksURL }}{{ $sources = append $sources "jwksURL" }}{{ end -}}
{{- if $ap.jwksKey }}{{ $sources = append $sources (ternary "existingSecret.jwksKey" "jwks" (ne $x.name "")) }}{{ end -}}
{{- if $ap.devTokensKey }}{{ $sources = append $sources (ternary "existingSecret.devTokensKey" "devTokens" (ne $x.name "")) }}{{ end -}}
{{- if not $sources -}}
{{- fail "approvals.enabled: no approvers' tokens; set approvals.auth.jwks, jwksURL or existingSecret.jwksKey (a JWKS, with issuer and audience), or, for development only, devTokens or existingSecret.devTokensKey" -}}
{{- end -}}
{{- if gt (len $sources) 1 -}}
{{- fail (printf "approvals.auth: more than one source of the approvers' tokens (%s); capsnap takes exactly one" (join ", " $sources)) -}}
{{- end -}}
{{- $auth := dict -}}
{{- if $ap.devTokensKey -}}
{{- $_ := set $auth "dev_tokens_file" (printf "%s/%s" $p.approvers $ap.devTokensKey) -}}
{{- else -}}
{{- if not (and $au.issuer $au.audience) -}}
{{- fail "approvals.auth.issuer and approvals.auth.audience are required with a JWKS: capsnap holds every approver's token to them" -}}
{{- end -}}
{{- $_ := set $auth "issuer" $au.issuer -}}
{{- $_ := set $auth "audience" $au.audience -}}
{{- if $au.jwksURL -}}
{{- $_ := set $auth "jwks_url" $au.jwksURL -}}
{{- else -}}
{{- $_ := set $auth "jwks_file" (printf "%s/%s" $p.approvers $ap.jwksKey) -}}
{{- end -}}
{{- with $au.identityClaim }}{{ $_ := set $auth "identity_claim" . }}{{ end -}}
{{- with $au.groupsClaim }}{{ $_ := set $auth "groups_claim" . }}{{ end -}}
{{- end -}}
{{- $_ := set $ac "addr" (printf "0.0.0.0:%d" (int $a.port)) -}}
{{- $_ := set $ac "base_url" (include "capsnap.approvals.baseURL" .) -}}
{{- $_ := set $ac "auth" $auth -}}
{{- $_ := set $c "approvals" $ac -}}
{{- end -}}
{{- toYaml $c -}}
{{- end -}}

{{/* The policy ConfigMap's data: the policy, and the lockfile if any. */}}
{{- define "capsnap.policyData" -}}
{{- $d := dict "policy.yaml" .Values.policy -}}
{{- with .Values.lockfile }}{{ $_ := set $d "capsnap.lock" . }}{{ end -}}
{{- toYaml $d -}}
{{- end -}}
