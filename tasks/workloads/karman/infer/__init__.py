"""karman's rollouts: the infer stage's plan of a rollout of a Pix2Pix generator, and its child job in each framework (torch, TensorFlow, JAX), scored against the solver."""
