{{/* Standard names: any release name and namespace work. */}}
{{- define "shardctl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "shardctl.fullname" -}}
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

{{/* A component's name: fullname cut so that "-<suffix>" still fits 63 characters. */}}
{{- define "shardctl.component" -}}
{{- $root := index . 0 }}{{ $suffix := index . 1 }}
{{- printf "%s-%s" (include "shardctl.fullname" $root | trunc (int (sub 62 (len $suffix))) | trimSuffix "-") $suffix }}
{{- end }}

{{- define "shardctl.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "shardctl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shardctl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "shardctl.labels" -}}
helm.sh/chart: {{ include "shardctl.chart" . }}
{{ include "shardctl.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "shardctl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "shardctl.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "shardctl.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The namespace jobs go to by default, and every namespace the dispatcher may create jobs in. */}}
{{- define "shardctl.jobNamespace" -}}
{{- default .Release.Namespace .Values.kubernetes.namespace }}
{{- end }}

{{- define "shardctl.jobNamespaces" -}}
{{- $all := list (include "shardctl.jobNamespace" .) }}
{{- range .Values.kubernetes.namespaces }}{{ $all = append $all . }}{{ end }}
{{- $all | uniq | toJson }}
{{- end }}

{{- define "shardctl.dbSecretName" -}}
{{- default (include "shardctl.component" (list . "db")) .Values.database.existingSecret }}
{{- end }}

{{- define "shardctl.dbSecretKey" -}}
{{- if .Values.database.existingSecret }}{{ .Values.database.existingSecretKey }}{{ else }}url{{ end }}
{{- end }}

{{- define "shardctl.usesPostgres" -}}
{{- if or .Values.database.existingSecret .Values.database.url }}true{{ end }}
{{- end }}

{{- define "shardctl.adminSecretName" -}}
{{- default (include "shardctl.component" (list . "admin")) .Values.bootstrapAdmin.existingSecret }}
{{- end }}

{{- define "shardctl.adminSecretKey" -}}
{{- if .Values.bootstrapAdmin.existingSecret }}{{ .Values.bootstrapAdmin.existingSecretKey }}{{ else }}token{{ end }}
{{- end }}

{{- define "shardctl.publicUrl" -}}
{{- default (printf "http://%s.%s.svc:%d" (include "shardctl.fullname" .) .Release.Namespace (int .Values.service.port)) .Values.publicUrl }}
{{- end }}

{{/* Refusals that no schema can say: they name the value and the fix. */}}
{{- define "shardctl.validate" -}}
{{- if not (include "shardctl.usesPostgres" .) }}
{{- if or (gt (int .Values.api.replicas) 1) (gt (int .Values.dispatcher.replicas) 1) .Values.autoscaling.enabled }}
{{- fail "database: SQLite (no database.url or database.existingSecret) lives in one pod's emptyDir, so it cannot serve api.replicas > 1, dispatcher.replicas > 1 or autoscaling; set database.url (or database.existingSecret) to a PostgreSQL URL, or set api.replicas=1, dispatcher.replicas=1 and autoscaling.enabled=false" }}
{{- end }}
{{- end }}
{{- if and .Values.oauth2Proxy.enabled (not .Values.oauth2Proxy.existingSecret) }}
{{- fail "oauth2Proxy.existingSecret: oauth2-proxy needs a Secret with client-id, client-secret and cookie-secret; create one and name it here" }}
{{- end }}
{{- end }}

{{/* The settings API and dispatcher share (SHARDCTL_*), as a list of EnvVar. */}}
{{- define "shardctl.env" -}}
- name: SHARDCTL_DATA_DIR
  value: /var/lib/shardctl
{{- if include "shardctl.usesPostgres" . }}
- name: SHARDCTL_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "shardctl.dbSecretName" . }}
      key: {{ include "shardctl.dbSecretKey" . }}
{{- end }}
- name: SHARDCTL_PUBLIC_URL
  value: {{ include "shardctl.publicUrl" . | quote }}
- name: SHARDCTL_BACKENDS
  value: '["kubernetes"]'
- name: SHARDCTL_KUBERNETES_NAMESPACE
  value: {{ include "shardctl.jobNamespace" . | quote }}
- name: SHARDCTL_KUBERNETES_NAMESPACES
  value: {{ .Values.kubernetes.namespaces | toJson | quote }}
- name: SHARDCTL_KUBERNETES_DEFAULT_IMAGE
  value: {{ .Values.image.runtime | quote }}
- name: SHARDCTL_KUBERNETES_QUEUES
  value: {{ .Values.kubernetes.queues | toJson | quote }}
- name: SHARDCTL_POOLS_FILE
  value: /etc/shardctl/pools.yaml
{{- range $name, $value := .Values.settings }}
- name: SHARDCTL_{{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}

{{/* Volumes every shardctl container needs with a read-only root filesystem. */}}
{{- define "shardctl.volumes" -}}
- name: tmp
  emptyDir: {}
- name: data
  emptyDir: {}
- name: config
  configMap:
    name: {{ include "shardctl.component" (list . "config") }}
{{- end }}

{{- define "shardctl.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: data
  mountPath: /var/lib/shardctl
- name: config
  mountPath: /etc/shardctl
  readOnly: true
{{- end }}

{{/* The config the pods read, hashed into their annotations so a values change rolls them. */}}
{{- define "shardctl.configChecksum" -}}
{{- $parts := list (include "shardctl.env" .) (include (print $.Template.BasePath "/configmap.yaml") .) .Values.database .Values.bootstrapAdmin.existingSecret .Values.oauth2Proxy }}
{{- $parts | toJson | sha256sum }}
{{- end }}
