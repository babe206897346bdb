"""The har BiLSTM as each framework's documentation teaches it: a plain PyTorch loop over nn.LSTM, Keras' Model.fit over built-in LSTM layers, and JAX with optax and lax.scan."""
