"""The training loop: the LightningModule around the plain ``GPT``, its optimizers and learning-rate schedules, the
average of its weights and the validation's attention pass. Nothing here imports the run's planning
(``training.run``) or the callbacks."""
