"""What the heads learn: head-type scores from the explicit attention probabilities on fixed probes, the loss by
position in the context and the in-context-learning score, phase-change detection, mean ablation, and the
self-contained HTML/JSON head report. Plain torch (no Lightning): the training callback
(``gptmini.training.callbacks.insight_logging``) and ``gptmini analyze`` both use it."""

from gptmini.insight.icl import PhaseChange, PhaseChangeDetector, icl_bands, icl_score, loss_by_position
from gptmini.insight.probes import Probes, make_probes
from gptmini.insight.scores import SCORES, Score, head_scores, score_patterns

__all__ = [
    "SCORES",
    "PhaseChange",
    "PhaseChangeDetector",
    "Probes",
    "Score",
    "head_scores",
    "icl_bands",
    "icl_score",
    "loss_by_position",
    "make_probes",
    "score_patterns",
]
