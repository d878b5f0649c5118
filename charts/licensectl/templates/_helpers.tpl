{{/*
Object names are fixed, not derived from the release name: licensectl is a cluster singleton, and
its defaults name them (the Lease "licensectl", the report URL
http://licensectl-reports.<namespace>.svc:8443/v1/reports in licensectl/config.py).
*/}}

{{/* Labels on every object. */}}
{{- define "licensectl.labels" -}}
app.kubernetes.io/name: licensectl
{{ include "licensectl.releaseLabels" . }}
{{- end }}

{{/* Labels on objects that are not licensectl's own (the GPU CRDs): the release's only. */}}
{{- define "licensectl.releaseLabels" -}}
app.kubernetes.io/part-of: licensectl
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The controller pods; the same selector as manifests/base (objects keep their identity across an adoption). */}}
{{- define "licensectl.selectorLabels" -}}
app.kubernetes.io/name: licensectl
app.kubernetes.io/component: controller
{{- end }}

{{/* The port of a host:port config value, e.g. "0.0.0.0:8080" -> 8080. */}}
{{- define "licensectl.port" -}}
{{- $parts := splitList ":" . -}}
{{- $port := last $parts -}}
{{- if not (regexMatch "^[0-9]+$" $port) -}}
{{- fail (printf "config: %q is not host:port" .) -}}
{{- end -}}
{{- $port -}}
{{- end }}

{{/*
A config value as an environment variable string: booleans lower-case, whole numbers without an
exponent (YAML numbers reach templates as float64, and 1000000 would print as 1e+06).
*/}}
{{- define "licensectl.envValue" -}}
{{- if kindIs "float64" . -}}
{{- if eq (floor .) . -}}{{ printf "%.0f" . }}{{- else -}}{{ . }}{{- end -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end }}

{{/*
Values of earlier releases: `helm upgrade --reuse-values` renders with the old release's values and
none of this chart's new defaults, so a key added after the first chart version may be missing.
Every such key is read with `dig` and its values.yaml default (tests/chart/test_chart_history.py
renders with each earlier chart version's values and compares with a fresh install).
*/}}

{{/* "true" when cert-manager issues the serving certificate (certManager.enabled; absent in the first chart versions). */}}
{{- define "licensectl.certManager" -}}
{{- if dig "certManager" "enabled" false .Values.AsMap }}true{{ end -}}
{{- end }}

{{/*
The config block as JSON, with the settings a pod needs (licensectl/config.py IN_CLUSTER) filled in
where the key is missing altogether (a release from before the key existed); an explicit null stays
null. Use: $config := include "licensectl.config" . | fromJson
*/}}
{{- define "licensectl.config" -}}
{{- $config := deepCopy (.Values.config | default dict) -}}
{{- $inCluster := dict "metricsAddress" "0.0.0.0:8080" "reportsAddress" "0.0.0.0:8443" "webhookAddress" "0.0.0.0:9443" "leaderElect" true "logFormat" "json" -}}
{{- range $key, $value := $inCluster -}}
{{- if not (hasKey $config $key) -}}
{{- $_ := set $config $key $value -}}
{{- end -}}
{{- end -}}
{{- toJson $config -}}
{{- end }}

{{/* A number setting, or licensectl's default when null (licensectl/config.py Settings). Call: list $config "key" default */}}
{{- define "licensectl.number" -}}
{{- $v := index (index . 0) (index . 1) -}}
{{- if kindIs "invalid" $v }}{{ index . 2 }}{{ else }}{{ $v }}{{ end -}}
{{- end }}

{{/* Check value combinations the schema cannot express. */}}
{{- define "licensectl.validate" -}}
{{- $config := include "licensectl.config" . | fromJson -}}
{{- if not .Values.image.repository -}}
{{- fail "image.repository is required: the registry path you pushed the licensectl image to (docs/operations.md#build-the-image)" -}}
{{- end -}}
{{- if and (gt (int .Values.replicaCount) 1) (not $config.leaderElect) -}}
{{- fail "replicaCount > 1 needs config.leaderElect=true: without a Lease every replica would write" -}}
{{- end -}}
{{- range $key := list "metricsAddress" "reportsAddress" -}}
{{- if not (get $config $key) -}}
{{- fail (printf "config.%s must be host:port in a pod (the Services and probes use its port)" $key) -}}
{{- end -}}
{{- end -}}
{{- if and (include "licensectl.certManager" .) (eq (toString $config.tlsMode) "self-managed") -}}
{{- fail "certManager.enabled needs config.tlsMode=secret (or null): cert-manager writes the TLS Secret" -}}
{{- end -}}
{{- /* client-go's rule, which licensectl's Lease loop follows: lease > renew deadline > retry period x 1.2. */ -}}
{{- $lease := include "licensectl.number" (list $config "leaseDurationSeconds" 15.0) | float64 -}}
{{- $renew := include "licensectl.number" (list $config "renewDeadlineSeconds" 10.0) | float64 -}}
{{- $retry := include "licensectl.number" (list $config "retryPeriodSeconds" 2.0) | float64 -}}
{{- if not (lt $renew $lease) -}}
{{- fail (printf "config.renewDeadlineSeconds (%v) must be less than config.leaseDurationSeconds (%v): a leader must give up before its Lease can be taken" $renew $lease) -}}
{{- end -}}
{{- if not (lt (mulf $retry 1.2) $renew) -}}
{{- fail (printf "config.retryPeriodSeconds (%v) x 1.2 must be less than config.renewDeadlineSeconds (%v): the leader needs a retry before it gives up" $retry $renew) -}}
{{- end -}}
{{- /* rolloutSteps: the schema checks each step; increasing is checked here, as licensectl does. */ -}}
{{- with $config.rolloutSteps -}}
{{- $last := 0.0 -}}
{{- range $part := splitList "," . -}}
{{- $step := trim $part -}}
{{- if $step -}}
{{- $v := trimSuffix "%" $step | float64 -}}
{{- if not (lt $last $v) -}}
{{- fail (printf "config.rolloutSteps %q must increase (e.g. 10%%,50%%,100%%)" $config.rolloutSteps) -}}
{{- end -}}
{{- $last = $v -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
RBAC objects from a manifests/ file (files/ holds a copy, `make chart-files`): the rules are
written, commented and tested once (tests/e2e/test_rbac.py proves each is used), and the chart moves them into the release
namespace and adds its labels. A custom config.leaseName replaces the Lease's resourceNames.
Call: include "licensectl.rbacFrom" (list $ "files/rbac.yaml").
*/}}
{{- define "licensectl.rbacFrom" -}}
{{- $root := index . 0 -}}
{{- range $doc := splitList "\n---\n" ($root.Files.Get (index . 1)) }}
{{- $o := fromYaml $doc }}
{{- if $o }}
{{- $meta := $o.metadata }}
{{- $_ := set $meta "labels" (merge (include "licensectl.labels" $root | fromYaml) ($meta.labels | default dict)) }}
{{- if has $o.kind (list "Role" "RoleBinding") }}
{{- $_ := set $meta "namespace" $root.Release.Namespace }}
{{- end }}
{{- range $s := $o.subjects | default list }}
{{- $_ := set $s "namespace" $root.Release.Namespace }}
{{- end }}
{{- if and (eq $o.kind "Role") $root.Values.config.leaseName }}
{{- range $r := $o.rules }}
{{- if and (has "leases" $r.resources) $r.resourceNames }}
{{- $_ := set $r "resourceNames" (list $root.Values.config.leaseName) }}
{{- end }}
{{- end }}
{{- end }}
{{- /* A custom config.webhookConfiguration replaces that rule's resourceNames too. */}}
{{- range $r := $o.rules | default list }}
{{- if and (or (has "mutatingwebhookconfigurations" $r.resources) (has "validatingwebhookconfigurations" $r.resources)) $r.resourceNames $root.Values.config.webhookConfiguration }}
{{- $_ := set $r "resourceNames" (list $root.Values.config.webhookConfiguration) }}
{{- end }}
{{- end }}
---
{{ toYaml $o }}
{{- end }}
{{- end }}
{{- end }}

{{/* The alert groups, from the one PrometheusRule file promtool and vmalert-tool test, with the
placeholder runbook base replaced by monitoring.runbookBaseUrl (docs/operations.md#runbook-links). */}}
{{- define "licensectl.alertGroups" -}}
{{- $placeholder := "https://licensectl.invalid/docs/operations.md#" -}}
{{- $base := printf "%s#" (trimSuffix "/" (dig "monitoring" "runbookBaseUrl" "https://licensectl.invalid/docs/operations.md" .Values.AsMap)) -}}
{{- $rule := .Files.Get "files/prometheusrule.yaml" | replace $placeholder $base | fromYaml -}}
{{- toYaml $rule.spec.groups -}}
{{- end }}

{{/* Labels on monitoring objects: the chart's, plus monitoring.labels for operator selectors. */}}
{{- define "licensectl.monitoringLabels" -}}
{{ include "licensectl.labels" . }}
app.kubernetes.io/component: monitoring
{{- with .Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}
