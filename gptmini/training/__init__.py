"""Training, in three parts: ``run`` (config -> plan -> build: the Hydra app), ``loop`` (the LightningModule, its
optimizers and schedules) and ``callbacks`` (loggers, console, guards). ``hardware``, ``errors`` and
``lightning_compat`` are what all three use: the machine, the run's error, the Lightning internals relied upon.

The top layer: it may import every other part of gptmini; nothing else imports it."""
