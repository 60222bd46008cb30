{{- define "gpusteward.name" -}}
{{- default "gpusteward" .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpusteward.labels" -}}
app.kubernetes.io/name: {{ include "gpusteward.name" .root }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: gpusteward
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "gpusteward.selector" -}}
app.kubernetes.io/name: {{ include "gpusteward.name" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpusteward.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "gpusteward.podSecurity" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "gpusteward.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{- define "gpusteward.extenderURL" -}}
http://{{ include "gpusteward.name" . }}-extender.{{ .Release.Namespace }}.svc:{{ .Values.extender.port }}
{{- end -}}

{{- define "gpusteward.extenderEntry" -}}
filterVerb: filter
prioritizeVerb: prioritize
weight: {{ .Values.scheduler.extenderWeight }}
nodeCacheCapable: true
ignorable: true
httpTimeout: {{ .Values.scheduler.httpTimeout }}
managedResources:
  - name: nvidia.com/gpu
    ignoredByScheduler: false
  - name: nvidia.com/gpu.shared
    ignoredByScheduler: false
  - name: nvidia.com/mig-1g.10gb
    ignoredByScheduler: false
  - name: nvidia.com/mig-1g.20gb
    ignoredByScheduler: false
  - name: nvidia.com/mig-2g.20gb
    ignoredByScheduler: false
  - name: nvidia.com/mig-3g.40gb
    ignoredByScheduler: false
  - name: nvidia.com/mig-4g.40gb
    ignoredByScheduler: false
  - name: nvidia.com/mig-7g.80gb
    ignoredByScheduler: false
{{- end -}}
