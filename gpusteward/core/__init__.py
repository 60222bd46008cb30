"""Pure model, policy and decisions: no I/O, no clock, no SDK imports."""
