"""The training loop (docs/development.md lists the modules). Nothing here imports the run's planning
(``training.run``) or the callbacks."""
