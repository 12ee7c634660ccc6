"""Running the suite as local processes: `warden stack up` and `warden demo`."""
