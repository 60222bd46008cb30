"""gpusteward: make Kubernetes act on what its GPUs are actually doing."""

# The package's version, written once: pyproject.toml reads it when the package is built
# (tool.setuptools.dynamic), `--version` here, without importlib.metadata (some 30 ms).
__version__ = "0.1.0"
