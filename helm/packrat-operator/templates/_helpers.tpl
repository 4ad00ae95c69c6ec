{{/* Names, labels and image references shared by every template of the chart. */}}

{{- define "packrat-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<chart>, or the release name when it already contains the chart name. */}}
{{- define "packrat-operator.fullname" -}}
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

{{- define "packrat-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "packrat-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "packrat-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "packrat-operator.labels" -}}
helm.sh/chart: {{ include "packrat-operator.chart" . }}
{{ include "packrat-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: packrat
{{- end }}

{{- define "packrat-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "packrat-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* "repository:tag" or "repository@digest"; the tag defaults to the chart's appVersion. */}}
{{- define "packrat-operator.imageRef" -}}
{{- $img := index . 0 }}
{{- $root := index . 1 }}
{{- if $img.digest }}
{{- printf "%s@%s" $img.repository $img.digest }}
{{- else }}
{{- printf "%s:%s" $img.repository (default $root.Chart.AppVersion $img.tag) }}
{{- end }}
{{- end }}

{{- define "packrat-operator.image" -}}
{{- include "packrat-operator.imageRef" (list .Values.image .) }}
{{- end }}

{{- define "packrat-operator.servingImage" -}}
{{- include "packrat-operator.imageRef" (list .Values.servingImage .) }}
{{- end }}

{{/* The pod-level security context shared by the operator and the test pod. */}}
{{- define "packrat-operator.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.runAsUser }}
runAsGroup: {{ .Values.runAsGroup }}
fsGroup: {{ .Values.runAsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "packrat-operator.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: {{ .Values.runAsUser }}
runAsGroup: {{ .Values.runAsGroup }}
privileged: false
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}
