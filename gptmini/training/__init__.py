"""Training, in three parts: ``run`` (the Hydra app), ``loop`` and ``callbacks``, over what all three use
(docs/development.md). The top layer: it may import every other part of gptmini; nothing else imports it."""
