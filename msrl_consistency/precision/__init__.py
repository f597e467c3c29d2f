"""Precision plans: which layers of a policy must stay in fp32 when the rest runs in fp16 or int8, judged in policy
terms (``python -m msrl_consistency.precision``).

``layers`` (the layers and their ONNX nodes), ``lowering`` (a candidate in the emulation or in Lite's quantization,
against the same graph unlowered), ``evaluate`` (a candidate in policy terms), ``search`` (the cheapest kept set),
``plan`` (the whole, and the manifest's ``plan``), ``write`` (the plan's bundle and ``plan.md``).
"""
