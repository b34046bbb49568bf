"""Lightning callbacks: the loggers (TensorBoard: attention, samples, throughput, head insight, the ATTENTION tab's
summary), the console (progress bar, progress lines, model summary), the guards that stop, save or reseed a run,
and the helpers they run on (background work, torch's CPU threads)."""
