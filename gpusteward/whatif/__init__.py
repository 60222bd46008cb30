"""`gpusteward whatif`: what a policy would have done over the cluster's recorded history."""
