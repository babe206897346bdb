"""The training machinery every stage that trains shares: the one loop, the framework table and each framework's runtime."""
