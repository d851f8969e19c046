"""Closed-form and single-link models kept beside the discrete-event simulator as cross-checks."""
