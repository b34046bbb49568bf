"""What the heads learn: head-type scores from the explicit attention probabilities on fixed probes, the loss by
position in the context and the in-context-learning score, phase-change detection, mean ablation, and the
self-contained HTML/JSON head report. Plain torch (no Lightning)."""
