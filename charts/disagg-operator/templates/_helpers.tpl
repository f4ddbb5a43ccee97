{{/*
disagg-operator.name: the chart name, or nameOverride; truncated to 63 characters (a label value).
*/}}
{{- define "disagg-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
disagg-operator.fullname: the prefix of every object name. fullnameOverride, else the release
name when it already contains the chart name, else "<release>-<chart>"; truncated to 63
characters (DNS label) with a trailing "-" removed.
*/}}
{{- define "disagg-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
disagg-operator.chart: "<chart>-<version>" for the helm.sh/chart label ("+" is not allowed in
label values).
*/}}
{{- define "disagg-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
disagg-operator.selectorLabels: the labels that select the operator pods. They never change
across upgrades (a Deployment's selector is immutable).
*/}}
{{- define "disagg-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "disagg-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/*
disagg-operator.labels: the one label set of every object of the chart: the selector labels,
version, managed-by, chart and the user's commonLabels.
*/}}
{{- define "disagg-operator.labels" -}}
{{ include "disagg-operator.selectorLabels" . }}
app.kubernetes.io/part-of: disagg
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "disagg-operator.chart" . }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
disagg-operator.serviceAccountName: the operator's ServiceAccount, created or named by the user.
*/}}
{{- define "disagg-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "disagg-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
disagg-operator.image: the operator image reference; a digest pins it, else the tag, else the
chart's appVersion.
*/}}
{{- define "disagg-operator.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
disagg-operator.peeringName: the kopf peering object name (peering.name, else the full name).
*/}}
{{- define "disagg-operator.peeringName" -}}
{{- default (include "disagg-operator.fullname" .) .Values.peering.name -}}
{{- end -}}

{{/*
disagg-operator.metricsServiceName: the Service in front of the operator's /metrics endpoint.
*/}}
{{- define "disagg-operator.metricsServiceName" -}}
{{- printf "%s-metrics" (include "disagg-operator.fullname" . | trunc 55 | trimSuffix "-") -}}
{{- end -}}

{{/*
disagg-operator.rbacRules: the operator's RBAC rules, generated from the operator package into
files/operator-rbac-rules.yaml (never edited here); returned as YAML for fromYaml.
*/}}
{{- define "disagg-operator.rbacRules" -}}
{{- .Files.Get "files/operator-rbac-rules.yaml" -}}
{{- end -}}

{{/*
disagg-operator.validate: refuses contradictory values with a message naming them (the schema
checks each value alone; this checks them together).
*/}}
{{- define "disagg-operator.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.peering.enabled) -}}
{{- fail (printf "replicaCount=%d needs peering.enabled=true: without kopf peering every replica would reconcile the same objects" (int .Values.replicaCount)) -}}
{{- end -}}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.enabled) -}}
{{- fail "metrics.serviceMonitor.enabled=true needs metrics.enabled=true: the ServiceMonitor scrapes the metrics Service" -}}
{{- end -}}
{{- if and .Values.metrics.enabled (eq (int .Values.metrics.port) (int .Values.health.port)) -}}
{{- fail (printf "metrics.port=%d is health.port too: give the metrics endpoint a port of its own" (int .Values.metrics.port)) -}}
{{- end -}}
{{- end -}}
