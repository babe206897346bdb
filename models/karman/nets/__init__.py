"""Neural surrogates: network shapes (config.py, framework-free) and the Pix2Pix networks in torch (pix2pix.py), imported from their modules so that planning never loads a framework."""
