import gc

# Start-up (torch, Lightning, Hydra, the model) makes millions of long-lived objects and next to no garbage, so
# the collector's passes over them find nothing: it stays off until the fit starts (app.fit freezes what start-up
# made and turns it back on).
gc.disable()

from gptmini.training.run.app import main  # noqa: E402

main()
gc.freeze()  # the process ends: the interpreter's last collections need not walk the objects it made
