"""PPO: GAE, the loss and compiled train step, and the training loop with its parts (seeds, learner, rollout,
evaluation, data parallel)."""
