"""The fleet report: allocated vs actually used GPUs, by team, card, node, namespace or class."""
