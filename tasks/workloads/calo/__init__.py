"""The calorimeter GAN workload (3DGAN): synthetic electron showers in 51x51x25 cells, their physics metrics and the published generator and discriminator."""
