"""Evaluation of a checkpoint, blessing, and SavedModel export in the TF Serving layout."""
