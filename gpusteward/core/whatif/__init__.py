"""What-if replay: the reclaimer's own decision, stepped through recorded history."""
