"""What a verdict is judged with: tolerances and statistics (``stats``), the policy-level bounds (``policy_bounds``,
``policy_level``), batch invariance, the diagnosis of a failure's stage (``evidence``, ``diagnose``) and the layer by
layer localisation (``localize``). The pipeline (``inference.compare``) calls them; they call nothing of it."""
