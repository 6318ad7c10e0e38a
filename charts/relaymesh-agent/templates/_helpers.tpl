{{/* Full name of the release's objects: the release name, unless it already holds the chart name. */}}
{{- define "relaymesh-agent.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Name of cluster-scoped objects: unique per release namespace too. */}}
{{- define "relaymesh-agent.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "relaymesh-agent.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "relaymesh-agent.serviceAccountName" -}}
{{- default (include "relaymesh-agent.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "relaymesh-agent.selectorLabels" -}}
app.kubernetes.io/name: relaymesh-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "relaymesh-agent.labels" -}}
{{ include "relaymesh-agent.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: relaymesh
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The image: repository@digest, else repository:tag (default appVersion). */}}
{{- define "relaymesh-agent.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}
