"""The peer: CLI, config, supervisor, learner, checkpoints, status and the local swarm."""
