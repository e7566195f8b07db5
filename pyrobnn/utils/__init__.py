"""What every layer above uses and that knows nothing of Bayesian networks: atomic saving and
safe loading (:mod:`.io`), checks on user input that name the argument (:mod:`.validation`),
the memory budget (:mod:`.memory`), ``torch.compile`` settings (:mod:`.runtime`) and the progress
bar (:mod:`.progress`). Nothing here imports another part of pyrobnn."""
