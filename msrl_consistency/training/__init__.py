"""PPO: pure GAE, the loss and compiled train-step Cell, and the training loop."""
