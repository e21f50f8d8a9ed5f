"""Observing activations: the observers (the calibration hot path), their exact percentile
selection, and the instrumenter that attaches one observer per slot to a model view."""
