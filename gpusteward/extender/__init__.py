"""The kube-scheduler HTTP extender."""
