"""Local sandbox cluster: real control plane built from Go modules, kwok fake GPU nodes."""
