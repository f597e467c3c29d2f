"""The MindSpore runtimes: ``ms-cell``/``ms-graph`` (the policy Cell, the reference) and ``ms-mindir``.

The contract they implement and the registry of every runtime live in ``inference.runtimes``.
"""
