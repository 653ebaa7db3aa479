"""`bench calibrate`: fit the simulated engine's step times to this machine (fit)."""
