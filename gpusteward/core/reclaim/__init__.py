"""Idle-GPU reclamation decisions: pure functions of a Snapshot and an explicit `now`."""
