"""The layer every method family stands on, importing none of them: the flat potential
(:mod:`.potential`), the minibatch log joint and its loop (:mod:`.minibatch`), starting positions
(:mod:`.starts`), the integrators MCLMC, SMILE and NUTS share (:mod:`.integrators`), what a sampler
is (:mod:`.kernel`: a kernel, its adaptation, its data) and the one runner that runs them all
(:mod:`.runner`) with their state records (:mod:`.records`) and execution paths
(:mod:`.execution`), the step-failure policy (:mod:`.failures`), checkpoints (:mod:`.checkpoints`),
the curvature estimate (:mod:`.curvature`) and process spreading (:mod:`.processes`). A sampler
is a kernel in its family's folder run by this layer's runner; an optimizer-based method calls
into this layer."""
