"""ksim: RL tasks on MuJoCo MJX, trained with PPO on one device or on all of them."""
