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

{{/* An image reference: repository@digest when a digest is set (the tag is then ignored), else
repository:tag. Takes (list image defaultTag). */}}
{{/* The cluster-forming Job's labels: the chart's, without the pods' selector labels. */}}
{{- define "walrus.jobLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/part-of: {{ include "walrus.name" . }}
app.kubernetes.io/component: create-cluster
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "walrus.image" -}}
{{- $img := index . 0 -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (toString ($img.tag | default (index . 1))) -}}
{{- end -}}
{{- end }}

{{/* The pod's ServiceAccount: the created one, a named one, or none (the default). */}}
{{- define "walrus.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "walrus.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name -}}
{{- end -}}
{{- end }}

{{/* Where the auth Secret is mounted in the walrus container, and the file walrus reads. */}}
{{/*
Cluster mode: the DNS name of pod i, (list $ i) -> <fullname>-<i>.<fullname>-headless.<namespace>.svc.<domain>;
with i "$i", the shell loop's. The headless Service publishes it from the pod's start
(publishNotReadyAddresses), so peers find a node that is still restoring.
*/}}
{{- define "walrus.podHost" -}}
{{- $ := index . 0 -}}
{{- $fullname := include "walrus.fullname" $ -}}
{{- printf "%s-%v.%s-headless.%s.svc.%s" $fullname (index . 1) $fullname $.Release.Namespace $.Values.cluster.clusterDomain -}}
{{- end }}

{{- define "walrus.passwordDir" -}}/etc/walrus-secret{{- end }}

{{/*
Valkey's Unix socket, its only listener for clients (--port 0): on an emptyDir mounted in the
Valkey and walrus containers only, so no other process reaches Valkey around walrus. Cluster
mode: walrus's managed Valkey puts its socket in a directory walrus creates inside it, mode
0700 (the emptyDir's own root is open to every container that mounts it).
*/}}
{{- define "walrus.socketDir" -}}/run/valkey{{- end }}
{{- define "walrus.valkeySocket" -}}{{ include "walrus.socketDir" . }}/valkey.sock{{- end }}
{{- define "walrus.managedSocketDir" -}}{{ include "walrus.socketDir" . }}/walrus{{- end }}

{{/* Where tls.existingSecret is mounted: tls.crt, tls.key, ca.crt. */}}
{{- define "walrus.tlsDir" -}}/etc/walrus-tls{{- end }}
{{- define "walrus.passwordFile" -}}{{ include "walrus.passwordDir" . }}/password{{- end }}

{{/*
The settings walrus needs from Valkey (src/upstream/settings.rs), as valkey-server arguments.
tests/it/deployment_kubernetes.rs checks this list against that file.
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
walrus's effective configuration: the chart's settings, with each key of .Values.config set
over them (a value there wins, false and 0 included), as {section: {key: value}}. Takes
(list $ out) and fills the dict out, so that walrus.toml and the checks see the same values.
*/}}
{{- define "walrus.config" -}}
{{- $out := index . 1 -}}
{{- $ := index . 0 -}}
{{- with $ -}}
{{- $v := .Values -}}
{{- $upstream := dict "mode" "external" "address" (printf "unix:%s" (include "walrus.valkeySocket" .)) "strict_settings" $v.upstream.strictSettings -}}
{{- if $v.cluster.enabled -}}
{{- /* Managed: walrus restarts the node from an RDB to restore it in place. */ -}}
{{- $args := list "--cluster-node-timeout" (toString (int64 $v.cluster.nodeTimeoutMs)) -}}
{{- with $v.valkey.maxmemory -}}
{{- $args = concat $args (list "--maxmemory" .) -}}
{{- end -}}
{{- $upstream = dict "mode" "managed" "socket_dir" (include "walrus.managedSocketDir" .) "valkey_server" "/usr/local/bin/valkey-server" "extra_args" (concat $args $v.valkey.args) -}}
{{- end -}}
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
{{- if $v.tls.enabled -}}
{{- $dir := include "walrus.tlsDir" . -}}
{{- $tls := dict "listen" (printf "0.0.0.0:%d" (int $v.tls.port)) "cert_file" (printf "%s/tls.crt" $dir) "key_file" (printf "%s/tls.key" $dir) "auth_clients" $v.tls.authClients "auth_clients_user" $v.tls.authClientsUser "reload_interval_ms" (int64 $v.tls.reloadIntervalMs) -}}
{{- if ne $v.tls.authClients "no" -}}
{{- $_ := set $tls "ca_cert_file" (printf "%s/ca.crt" $dir) -}}
{{- end -}}
{{- $_ := set $cfg "tls" $tls -}}
{{- if $v.tls.disablePlaintext -}}
{{- $_ := set (index $cfg "proxy") "listen" "" -}}
{{- end -}}
{{- end -}}
{{- if $v.cluster.enabled -}}
{{- $peers := list -}}
{{- range $i := until (int $v.cluster.shards) -}}
{{- $peers = append $peers (printf "%s:%d@%d" (include "walrus.podHost" (list $ $i)) (int $v.proxy.port) (int $v.cluster.busPort)) -}}
{{- end -}}
{{- /* cluster.announce_ip comes from --cluster-announce-ip $(POD_IP). */ -}}
{{- $_ := set $cfg "cluster" (dict "enabled" true "bus_port" (int $v.cluster.busPort) "peers" $peers) -}}
{{- end -}}
{{- range $section, $keys := $v.config -}}
{{- if not (hasKey $cfg $section) -}}
{{- $_ := set $cfg $section dict -}}
{{- end -}}
{{- range $key, $value := $keys -}}
{{- $_ := set (index $cfg $section) $key $value -}}
{{- end -}}
{{- end -}}
{{- range $section, $keys := $cfg -}}
{{- $_ := set $out $section $keys -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
walrus.toml: walrus.config, one [section] per table; values are written as JSON, which for
strings, numbers, booleans and arrays is also TOML.
*/}}
{{- define "walrus.toml" -}}
{{- $cfg := dict -}}
{{- $_ := include "walrus.config" (list . $cfg) -}}
# Rendered by the walrus Helm chart from its values; every key and its default are in the
# repository's config.toml. Unknown keys are errors.
{{- range $section, $keys := $cfg }}

[{{ $section }}]
{{- range $key, $value := $keys }}
{{ $key }} = {{ toJson $value }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Bytes of a Kubernetes quantity ("10Gi", "500M", 1073741824), as a float. The schema lets
only these forms through; anything else fails here rather than being guessed at.
*/}}
{{- define "walrus.quantityBytes" -}}
{{- $q := toString . -}}
{{- $num := regexFind "^[0-9]+([.][0-9]+)?" $q -}}
{{- $units := dict "" 1.0 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 -}}
{{- $unit := trimPrefix $num $q -}}
{{- if or (not $num) (not (hasKey $units $unit)) -}}
{{- fail (printf "persistence.size %q is not a quantity the chart understands (e.g. 10Gi, 500Mi, 20G)" $q) -}}
{{- end -}}
{{- mulf (float64 $num) (index $units $unit) -}}
{{- end }}

{{/*
Bytes of a size as walrus and valkey.conf write it ("768mb", "4gb", "1g", "10Gi", 1000000:
k, m, g, t powers of 1000, kb, mb, gb, tb and Ki, Mi, Gi, Ti powers of 1024, any case;
src/units/mod.rs), as a float. Takes (list size what), what naming the value in the error.
*/}}
{{- define "walrus.sizeBytes" -}}
{{- $q := lower (trim (toString (index . 0))) -}}
{{- $num := regexFind "^[0-9]+([.][0-9]+)?" $q -}}
{{- $units := dict "" 1.0 "b" 1.0 "k" 1e3 "m" 1e6 "g" 1e9 "t" 1e12 "kb" 1024.0 "ki" 1024.0 "kib" 1024.0 "mb" 1048576.0 "mi" 1048576.0 "mib" 1048576.0 "gb" 1073741824.0 "gi" 1073741824.0 "gib" 1073741824.0 "tb" 1099511627776.0 "ti" 1099511627776.0 "tib" 1099511627776.0 -}}
{{- $unit := trim (trimPrefix $num $q) -}}
{{- if or (not $num) (not (hasKey $units $unit)) -}}
{{- fail (printf "%s %q is not a size: a byte count, or a number with a unit as in valkey.conf (512kb, 64mb, 1gb)" (index . 1) (toString (index . 0))) -}}
{{- end -}}
{{- mulf (float64 $num) (index $units $unit) -}}
{{- end }}

{{/*
Milliseconds of a duration as walrus writes it (250, "500ms", "10s", "1.5m", "2h";
src/units/mod.rs), as a float. Takes (list duration what), what naming the value in the error.
*/}}
{{- define "walrus.millis" -}}
{{- $q := lower (trim (toString (index . 0))) -}}
{{- $num := regexFind "^[0-9]+([.][0-9]+)?" $q -}}
{{- $units := dict "" 1.0 "ms" 1.0 "s" 1e3 "m" 6e4 "min" 6e4 "h" 3.6e6 -}}
{{- $unit := trim (trimPrefix $num $q) -}}
{{- if or (not $num) (not (hasKey $units $unit)) -}}
{{- fail (printf "%s %q is not a duration: milliseconds, or a number with a unit (500ms, 10s, 5m, 1h)" (index . 1) (toString (index . 0))) -}}
{{- end -}}
{{- mulf (float64 $num) (index $units $unit) -}}
{{- end }}

{{/*
Where walrus's setting section.key comes from: "config.<section>.<key>" when .Values.config
sets it, else the chart's own value named. Takes (list $ section key chartValue).
*/}}
{{- define "walrus.settingFrom" -}}
{{- $ := index . 0 -}}
{{- if hasKey (get $.Values.config (index . 1) | default dict) (index . 2) -}}
{{- printf "config.%s.%s" (index . 1) (index . 2) -}}
{{- else -}}
{{- index . 3 -}}
{{- end -}}
{{- end }}

{{/* Refuses values that cannot work together. */}}
{{- define "walrus.checks" -}}
{{- $v := .Values -}}
{{- if not $v.image.repository -}}
{{- fail "image.repository is not set: no walrus image is published. Build one from the repository's root and push it where your nodes pull from:\n  docker build -t REGISTRY/walrus:0.1.0 --build-arg COMMIT=$(git rev-parse --short=12 HEAD) . && docker push REGISTRY/walrus:0.1.0\nthen install with --set image.repository=REGISTRY/walrus --set image.tag=0.1.0 (docs/deploy.md)" -}}
{{- end -}}
{{- /* The checks below see walrus's effective configuration: config: over the chart's values. */ -}}
{{- $cfg := dict -}}
{{- $_ := include "walrus.config" (list . $cfg) -}}
{{- $low := float64 $cfg.disk.low_watermark -}}
{{- $lowFrom := include "walrus.settingFrom" (list . "disk" "low_watermark" "disk.lowWatermark") -}}
{{- $high := float64 $cfg.disk.high_watermark -}}
{{- $highFrom := include "walrus.settingFrom" (list . "disk" "high_watermark" "disk.highWatermark") -}}
{{- if not (lt $low $high) -}}
{{- fail (printf "%s (%v) must be below %s (%v)" $lowFrom $low $highFrom $high) -}}
{{- end -}}
{{- $shutdownFrom := include "walrus.settingFrom" (list . "proxy" "shutdown_timeout_ms" "proxy.shutdownTimeoutMs") -}}
{{- $shutdown := include "walrus.millis" (list $cfg.proxy.shutdown_timeout_ms $shutdownFrom) | float64 -}}
{{- $drain := divf $shutdown 1000 | ceil | int64 -}}
{{- $need := add (int64 $v.preStopSleepSeconds) $drain 5 -}}
{{- if lt (int64 $v.terminationGracePeriodSeconds) $need -}}
{{- fail (printf "terminationGracePeriodSeconds (%v) must be at least %d: preStopSleepSeconds (%v) + %s (%v ms, rounded up to seconds) + 5 s to close the journal and stop Valkey" $v.terminationGracePeriodSeconds $need $v.preStopSleepSeconds $shutdownFrom $shutdown) -}}
{{- end -}}
{{- if $v.cluster.enabled -}}
{{- if not $v.networkPolicy.enabled -}}
{{- fail "cluster.enabled needs networkPolicy.enabled (and a CNI that enforces NetworkPolicies): Valkey's cluster bus listens on the pod's IP, and without the policy a node of another cluster that gets a recycled pod IP is met by this one's nodes, merging the two clusters and deleting the keys of the slots one side loses" -}}
{{- end -}}
{{- if $v.persistence.existingClaim -}}
{{- fail "cluster.enabled with persistence.existingClaim: every shard would use the one claim; each needs its own (the StatefulSet's claim template)" -}}
{{- end -}}
{{- if $v.auth.existingSecret -}}
{{- fail "cluster.enabled with auth.existingSecret: walrus's managed Valkey runs without a password (it listens on no TCP port, only on a Unix socket walrus's user alone can open); drop auth.existingSecret" -}}
{{- end -}}
{{- range $p := list (int $v.proxy.port) (int $v.metrics.port) -}}
{{- if eq $p (int $v.cluster.busPort) -}}
{{- fail (printf "cluster.busPort (%d) must differ from proxy.port and metrics.port: all listen in the same pod" (int $v.cluster.busPort)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $v.tls.enabled -}}
{{- if not $v.tls.existingSecret -}}
{{- fail "tls.enabled needs tls.existingSecret: a Secret with tls.crt, tls.key and ca.crt (a kubernetes.io/tls Secret, as cert-manager writes it)" -}}
{{- end -}}
{{- if $v.cluster.enabled -}}
{{- fail "tls.enabled with cluster.enabled: cluster clients are told walrus's plaintext port; TLS for a cluster is not supported yet" -}}
{{- end -}}
{{- range $p := list (int $v.proxy.port) (int $v.metrics.port) -}}
{{- if eq $p (int $v.tls.port) -}}
{{- fail (printf "tls.port (%d) must differ from proxy.port and metrics.port: all listen in the same pod" (int $v.tls.port)) -}}
{{- end -}}
{{- end -}}
{{- else if $v.tls.disablePlaintext -}}
{{- fail "tls.disablePlaintext needs tls.enabled: walrus would accept no client" -}}
{{- end -}}
{{- if not $v.cluster.enabled -}}
{{- $vu := $v.valkey.containerSecurityContext.runAsUser | default $v.podSecurityContext.runAsUser -}}
{{- $wu := $v.containerSecurityContext.runAsUser | default $v.podSecurityContext.runAsUser -}}
{{- if ne (toString $vu) (toString $wu) -}}
{{- fail (printf "valkey.containerSecurityContext.runAsUser (%v) and containerSecurityContext.runAsUser (%v) differ: Valkey's Unix socket is mode 700, for its own user, and walrus must connect to it" $vu $wu) -}}
{{- end -}}
{{- end -}}
{{- /* valkey-server reads "--port 6380" in one argument as the setting and its value, so the
name is the first word; a last setting with no value would take the chart's own "--port",
which follows, as its value (walrus's upstream.extra_args check, src/config/upstream.rs). */ -}}
{{- range $a := $v.valkey.args -}}
{{- $a = toString $a -}}
{{- if regexMatch "[[:cntrl:]]" $a -}}
{{- fail (printf "valkey.args must not hold control characters (tabs, line breaks): %q" $a) -}}
{{- end -}}
{{- if hasPrefix "--" $a -}}
{{- $name := lower (index (splitList " " (trimPrefix "--" $a)) 0) -}}
{{- if not (regexMatch "^[a-z0-9._-]+$" $name) -}}
{{- fail (printf "valkey.args: %q: a setting's name is letters, digits, '-', '_' and '.' (valkey-server would unquote a quoted one)" $a) -}}
{{- end -}}
{{- if has $name (list "port" "tls-port" "rdma-port" "rdma-bind" "bind" "unixsocket" "unixsocketperm" "unixsocketgroup" "include" "cluster-enabled" "cluster-port") -}}
{{- fail (printf "valkey.args must not set %s: Valkey listens only on its Unix socket, which walrus alone reaches; a TCP port would let clients around walrus (and include would read settings the chart cannot check)" $a) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with $v.valkey.args -}}
{{- $l := toString (last .) -}}
{{- if and (hasPrefix "--" $l) (eq (len (splitList " " (trim $l))) 1) (ne (lower (trim $l)) "--save") -}}
{{- fail (printf "valkey.args ends with %s and no value: valkey-server would take the chart's own next argument as its value" $l) -}}
{{- end -}}
{{- end -}}
{{- if eq (int $v.metrics.port) (int $v.proxy.port) -}}
{{- fail "metrics.port and proxy.port must differ" -}}
{{- end -}}
{{- /*
The journal's volume holds the ring and the checkpoints (two while a new one is written),
and all of it must stay below disk.low_watermark: walrus refuses to start when the ring alone
reaches it (a crash loop), and refuses writes when a checkpoint takes the rest. A checkpoint
is an RDB of the dataset, at most about valkey.maxmemory. An existing claim's size is not
known here.
*/ -}}
{{- if not $v.persistence.existingClaim -}}
{{- $mib := 1048576.0 -}}
{{- $size := include "walrus.quantityBytes" $v.persistence.size | float64 -}}
{{- $segments := $cfg.journal.segments -}}
{{- $segmentsFrom := include "walrus.settingFrom" (list . "journal" "segments" "journal.segments") -}}
{{- $segmentFrom := include "walrus.settingFrom" (list . "journal" "segment_size_bytes" "journal.segmentSizeBytes") -}}
{{- $segment := include "walrus.sizeBytes" (list $cfg.journal.segment_size_bytes $segmentFrom) | float64 -}}
{{- $ring := mulf (int64 $segments) $segment -}}
{{- /* Valkey's maxmemory: its last --maxmemory, which valkey.args (after the chart's own
--maxmemory) or, in a cluster, config.upstream.extra_args (all of Valkey's extra arguments)
may set. */ -}}
{{- $mem := toString $v.valkey.maxmemory -}}
{{- $memFrom := "valkey.maxmemory" -}}
{{- $args := $v.valkey.args -}}
{{- $argsFrom := "valkey.args" -}}
{{- if and $v.cluster.enabled (hasKey (get $v.config "upstream" | default dict) "extra_args") -}}
{{- $args = $cfg.upstream.extra_args -}}
{{- $argsFrom = "config.upstream.extra_args" -}}
{{- $mem = "" -}}
{{- $memFrom = "--maxmemory in config.upstream.extra_args" -}}
{{- end -}}
{{- range $i, $a := $args -}}
{{- $a = toString $a -}}
{{- if and (eq (lower $a) "--maxmemory") (lt (add1 $i) (len $args)) -}}
{{- $mem = toString (index $args (add1 $i)) -}}
{{- $memFrom = printf "--maxmemory in %s" $argsFrom -}}
{{- else if hasPrefix "--maxmemory " (lower $a) -}}
{{- $mem = trim (substr 12 (len $a) $a) -}}
{{- $memFrom = printf "--maxmemory in %s" $argsFrom -}}
{{- end -}}
{{- end -}}
{{- $memBytes := 0.0 -}}
{{- if $mem -}}
{{- $memBytes = include "walrus.sizeBytes" (list $mem $memFrom) | float64 -}}
{{- end -}}
{{- $rdbs := ternary 3 2 $v.cluster.enabled -}}
{{- $checkpoints := mulf $rdbs $memBytes -}}
{{- $need := addf $ring $checkpoints -}}
{{- if gt $need (mulf $size $low) -}}
{{- $minimum := divf $need (mulf $low $mib) | ceil | int64 -}}
{{- $what := printf "the journal ring (%s %v x %s %d = %d MiB)" $segmentsFrom $segments $segmentFrom (int64 $segment) (divf $ring $mib | int64) -}}
{{- $shrink := printf "%s, %s" $segmentsFrom $segmentFrom -}}
{{- if gt $memBytes 0.0 -}}
{{- $what = printf "%s plus %s of up to Valkey's maxmemory each (%s, %s)" $what (ternary "two checkpoints and a restore in place's RDB" "two checkpoints" $v.cluster.enabled) $mem $memFrom -}}
{{- $shrink = printf "%s or %s" $shrink $memFrom -}}
{{- end -}}
{{- fail (printf "persistence.size (%v) is too small: %s need %d MiB, below %s (%v) of the volume. Set persistence.size to at least %dMi, or shrink %s" $v.persistence.size $what (divf $need $mib | int64) $lowFrom $low $minimum $shrink) -}}
{{- end -}}
{{- end -}}
{{- end }}
