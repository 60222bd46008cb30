"""The idle-GPU reclaimer: snapshot -> decide (pure) -> act, as the single leader."""
