"""The run, in the order it happens: the config Hydra composes (``compose``, ``schema``), the checks and the frozen
plan they derive (``plan``, ``inputs``, ``resume``, ``run_folder``, ``memory``), then the Hydra app that builds the
trainer, data and module from them and fits (``app``)."""
