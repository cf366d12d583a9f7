"""The worker-count sensor."""
