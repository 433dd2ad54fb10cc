"""The learner, which knows nothing of the robot: the policy's networks, its memory, the observation
normaliser, and PPO's update (GAE, the loss, the minibatch epochs) as pure functions of arrays."""
