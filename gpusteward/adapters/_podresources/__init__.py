"""Stubs generated from the kubelet podresources v1 proto (command in api.proto)."""
