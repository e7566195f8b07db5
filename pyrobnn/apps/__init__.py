"""Applications built on the library: the ``pyrobnn`` command (:mod:`.cli`), its demo
(:mod:`.demo`), the sampling-versus-approximation study :mod:`.compare`, and the Bayesian VAE
(:mod:`.vae`). Nothing below imports them."""
