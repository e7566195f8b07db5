"""What every method returns and what reads it, below every method family: the result protocol
(:mod:`.protocol`), the posterior predictive over weight draws (:mod:`.predictive`), ArviZ
conversion and convergence diagnostics (:mod:`.diagnostics`, which take any result through the
protocol), and draws of the latent sites (:mod:`.posterior`), which use the two before them."""
