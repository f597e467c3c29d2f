"""The MindSpore runtimes: ``ms-cell``/``ms-graph`` (the policy Cell, the reference) and ``ms-mindir``.

The contract they implement and the registry of every runtime live in ``inference.runtimes``, which names no
module of this package: importing this package registers them there. Registered by ``MODULE:CLASS`` so that
registering imports no MindSpore; each module is imported when its runtime is first used.
"""

from inference.runtimes.registry import register

register("ms-cell", "msrl_consistency.runtimes.ms_cell:MsCellRuntime")
register("ms-graph", "msrl_consistency.runtimes.ms_cell:MsGraphRuntime")
register("ms-mindir", "msrl_consistency.runtimes.ms_mindir:MsMindirRuntime")
