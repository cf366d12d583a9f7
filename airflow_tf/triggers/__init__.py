"""Async triggers for deferrable waiting on the triggerer."""
