"""The Kármán workload: a Pix2Pix surrogate of a vortex street, trained on simulated flow past obstacles."""
