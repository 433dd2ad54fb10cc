"""Task classes: single-device RL and PPO, and their distributed (pmap) versions."""
