"""The grid keys the rules read, named once: a run's seed, width, loops, prelude and horizon."""

SEED, D, R, P, STEPS = "seed", "model.d_model", "model.n_loops", "model.n_prelude", "trainer.steps"
