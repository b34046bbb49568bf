"""Training: the Hydra app, the run's config schema and checks, the LightningModule, callbacks and schedules.

The top layer: it may import every other part of gptmini; nothing else imports it."""
