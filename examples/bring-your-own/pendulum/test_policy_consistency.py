"""What a team puts in its own CI: the exported MindIR must act like the Cell that trained it.

Run from this folder after train.py: ``python -m pytest test_policy_consistency.py``.
"""

from policy import make_policy

from msrl_consistency.testing import assert_policy_consistent


def test_exported_policy_acts_like_training():
    assert_policy_consistent(make_policy(), "contract.toml", "policy_model.mindir", checkpoint="policy.ckpt")
