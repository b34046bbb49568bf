"""Using a trained checkpoint: sampling, evaluation and attention-map export (each also a console script)."""
