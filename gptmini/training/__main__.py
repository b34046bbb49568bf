import gc

from gptmini.training.run.app import main

main()
# The process ends next: out of the collector's sight, the objects of the imports and the run are not walked
# again by its last collections at the interpreter's exit
gc.freeze()
