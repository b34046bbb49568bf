import gc

from gptmini.training.run.app import main

main()
gc.freeze()  # the process ends: the interpreter's last collections need not walk the objects it made
