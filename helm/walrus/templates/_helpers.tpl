{{/* Chart name. */}}
{{- define "walrus.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Resource name prefix: the release name, plus the chart name unless already in it. */}}
{{- define "walrus.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "walrus.selectorLabels" -}}
app.kubernetes.io/name: {{ include "walrus.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "walrus.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "walrus.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Where the auth Secret is mounted in the walrus container, and the file walrus reads. */}}
{{- define "walrus.passwordDir" -}}/etc/walrus-secret{{- end }}
{{- define "walrus.passwordFile" -}}{{ include "walrus.passwordDir" . }}/password{{- end }}

{{/*
The settings walrus needs from Valkey (src/upstream/settings.rs), as valkey-server arguments.
tests/deployment_kubernetes.rs checks this list against that file.
*/}}
{{- define "walrus.valkeySettings" -}}
- --save
- ""
- --appendonly
- "no"
- --repl-diskless-sync
- "yes"
- --repl-diskless-sync-delay
- "0"
- --repl-diskless-load
- on-empty-db
- --repl-backlog-size
- 256mb
- --repl-backlog-ttl
- "0"
- --client-output-buffer-limit
- replica 0 0 0
- --min-replicas-to-write
- "1"
- --min-replicas-max-lag
- "10"
- --maxmemory-policy
- noeviction
{{- end }}

{{/*
walrus.toml: the chart's settings, with each key of .Values.config set over them (a value
there wins, false and 0 included), one [section] per table; values are written as JSON, which for strings, numbers, booleans and arrays is also
TOML.
*/}}
{{- define "walrus.toml" -}}
{{- $v := .Values -}}
{{- $upstream := dict "mode" "external" "address" (printf "127.0.0.1:%d" (int $v.valkey.port)) "strict_settings" $v.upstream.strictSettings -}}
{{- if $v.auth.existingSecret -}}
{{- $_ := set $upstream "password_file" (include "walrus.passwordFile" .) -}}
{{- end -}}
{{- $cfg := dict
  "proxy" (dict "listen" (printf "0.0.0.0:%d" (int $v.proxy.port)) "shutdown_timeout_ms" (int64 $v.proxy.shutdownTimeoutMs))
  "upstream" $upstream
  "data" (dict "dir" "/data")
  "metrics" (dict "listen" (printf "0.0.0.0:%d" (int $v.metrics.port)))
  "log" (dict "level" $v.log.level "format" $v.log.format)
  "journal" (dict "segment_size_bytes" (int64 $v.journal.segmentSizeBytes) "segments" (int64 $v.journal.segments) "io_backend" $v.journal.ioBackend "direct_io" $v.journal.directIo)
  "disk" (dict "high_watermark" $v.disk.highWatermark "low_watermark" $v.disk.lowWatermark)
-}}
{{- range $section, $keys := $v.config -}}
{{- if not (hasKey $cfg $section) -}}
{{- $_ := set $cfg $section dict -}}
{{- end -}}
{{- range $key, $value := $keys -}}
{{- $_ := set (index $cfg $section) $key $value -}}
{{- end -}}
{{- end -}}
# Rendered by the walrus Helm chart from its values; every key and its default are in the
# repository's config.toml. Unknown keys are errors.
{{- range $section, $keys := $cfg }}

[{{ $section }}]
{{- range $key, $value := $keys }}
{{ $key }} = {{ toJson $value }}
{{- end }}
{{- end }}
{{- end }}

{{/* Refuses values that cannot work together. */}}
{{- define "walrus.checks" -}}
{{- $v := .Values -}}
{{- if not (lt (float64 $v.disk.lowWatermark) (float64 $v.disk.highWatermark)) -}}
{{- fail (printf "disk.lowWatermark (%v) must be below disk.highWatermark (%v)" $v.disk.lowWatermark $v.disk.highWatermark) -}}
{{- end -}}
{{- $drain := div (add (int64 $v.proxy.shutdownTimeoutMs) 999) 1000 -}}
{{- $need := add (int64 $v.preStopSleepSeconds) $drain 5 -}}
{{- if lt (int64 $v.terminationGracePeriodSeconds) $need -}}
{{- fail (printf "terminationGracePeriodSeconds (%v) must be at least %d: preStopSleepSeconds (%v) + proxy.shutdownTimeoutMs (%v ms, rounded up to seconds) + 5 s to close the journal and stop Valkey" $v.terminationGracePeriodSeconds $need $v.preStopSleepSeconds $v.proxy.shutdownTimeoutMs) -}}
{{- end -}}
{{- if eq (int $v.valkey.port) (int $v.proxy.port) -}}
{{- fail "valkey.port and proxy.port must differ: both listen in the same pod" -}}
{{- end -}}
{{- if eq (int $v.metrics.port) (int $v.proxy.port) -}}
{{- fail "metrics.port and proxy.port must differ" -}}
{{- end -}}
{{- if eq (int $v.metrics.port) (int $v.valkey.port) -}}
{{- fail "metrics.port and valkey.port must differ: both listen in the same pod" -}}
{{- end -}}
{{- end }}
