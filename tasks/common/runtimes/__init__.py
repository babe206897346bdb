"""The training machinery every stage that trains shares: the one loop, each framework's runtime, probe and preloads, checkpoints, the classifiers' trainers and the epoch order."""
