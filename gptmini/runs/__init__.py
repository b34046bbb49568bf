"""A run's files and their discovery, in one place: its checkpoints (``checkpoint``: ``weights_only`` loads, atomic
saves, checksums), the summary of them ``gptmini runs`` reads (``files``), the run record every checkpoint and run
folder keep and its one reader (``record``), which run or checkpoint a name means and the list of runs
(``discovery``, ``gptmini runs``), and opening a run for every command (``loading.open_run``)."""
