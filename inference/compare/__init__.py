"""The comparison, with no MindSpore: inputs, feeds, the reference, per-runtime checks, policy-level metrics,
episode replay, diagnosis, the first diverging layer (``localize``), golden files and the verifier that runs
them. Both sides run this same code."""
