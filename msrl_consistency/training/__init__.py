"""PPO: GAE, the loss and compiled train step, the training loop and its parts (seeds, learner, rollout, evaluation,
data parallel), and one run from config to run directory (``run.py``)."""
