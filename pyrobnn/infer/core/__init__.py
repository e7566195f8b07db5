"""The layer every method family stands on, importing none of them: the flat potential
(:mod:`.potential`), the minibatch log joint and its loop (:mod:`.minibatch`), starting positions
(:mod:`.starts`), the integrators MCLMC, SMILE and NUTS share (:mod:`.integrators`), the
step-failure policy (:mod:`.failures`), checkpoints (:mod:`.checkpoints`), the curvature estimate
(:mod:`.curvature`) and process spreading (:mod:`.processes`). A method is a kernel in its family's
folder plus calls into this layer."""
