"""The calo workload's pure computation: the 3DGAN's shapes and weights (nets.py) and its networks in torch (torch.py), the synthetic showers and their shower-shape metrics."""
