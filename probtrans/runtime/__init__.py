"""How probtrans's work runs: data-parallel processes (:mod:`~probtrans.runtime.distributed`),
progress bars, timings, what a public entry point leaves as it found it (Pyro's param store, the
random generators, the default dtype: :mod:`~probtrans.runtime.caller_state`), and mixed
precision (:mod:`~probtrans.runtime.precision`)."""
