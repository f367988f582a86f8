{{/* The chart's name. */}}
{{- define "jobpool.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name, used for every object the chart makes. */}}
{{- define "jobpool.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "jobpool.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "jobpool.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels that select the operator's pods. */}}
{{- define "jobpool.selectorLabels" -}}
app.kubernetes.io/name: {{ include "jobpool.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The app.kubernetes.io/* labels of every object; pass a dict with "root" and "component". */}}
{{- define "jobpool.labels" -}}
{{- $root := .root -}}
helm.sh/chart: {{ printf "%s-%s" $root.Chart.Name $root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "jobpool.selectorLabels" $root }}
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
app.kubernetes.io/part-of: jobpool
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The operator's ServiceAccount. */}}
{{- define "jobpool.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "jobpool.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The image all containers run. */}}
{{- define "jobpool.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Namespaces where the operator reads Secrets, as a JSON list; empty: every namespace. */}}
{{- define "jobpool.secretNamespaces" -}}
{{- $watched := .Values.operator.watchNamespaces -}}
{{- $chosen := .Values.rbac.secretNamespaces -}}
{{- if and $watched $chosen -}}
{{- range $chosen -}}
{{- if not (has . $watched) -}}
{{- fail (printf "rbac.secretNamespaces: %s is not in operator.watchNamespaces" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson (default $watched $chosen) -}}
{{- end -}}
