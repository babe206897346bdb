"""karman's bench-train --framework tensorflow, child side: the Keras Pix2Pix step served block by block to the benchmark process (TensorFlow stays out of the benchmark's own process)."""

import json
import sys
import time


def keras_step_server() -> None:
    """Reads one JSON line (size, batch_size, seed, threads, device, jit_compile); builds the default
    networks and the Keras step of the paper's recipe (the same as torch's bench-train), takes the
    first step (tracing and compilation: compile_s) and a second, answers "ready" with its facts,
    then serves timed blocks of steps (tasks.common.measures.step_timing.serve_steps)."""
    config = json.loads(sys.stdin.readline())
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(config["threads"])
    tf.config.threading.set_inter_op_parallelism_threads(min(config["threads"], 2))
    from models.karman.nets.config import NetConfig
    from models.karman.nets.pix2pix_keras import trainable_count
    from models.karman.nets.trainer_keras import KerasPix2Pix
    from models.karman.recipe import OptimConfig
    from tasks.common.measures.step_timing import serve_steps

    size, batch = config["size"], config["batch_size"]
    net = NetConfig(in_channels=4, out_channels=3, size=size)
    strategy = tf.distribute.OneDeviceStrategy("/gpu:0") if config["device"] == "cuda" else tf.distribute.get_strategy()
    model = KerasPix2Pix(net, OptimConfig(), strategy, batch, jit_compile=config["jit_compile"], seed=config["seed"])
    rng = np.random.default_rng(config["seed"])  # the torch side's distribution: inputs in [-1, 1], a binary mask, tanh targets
    cond = rng.uniform(-1, 1, (batch, size, size, 4)).astype(np.float32)
    cond[..., 3] = np.where(cond[..., 3] > 0.8, 1.0, -1.0)
    target = np.tanh(rng.standard_normal((batch, size, size, 3))).astype(np.float32)
    cond, target = tf.constant(cond), tf.constant(target)

    def run(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            losses = model.train_step(cond, target)
        float(losses["loss_l1"])  # waits for the last step
        return time.perf_counter() - t0

    compile_s = run(1)
    run(1)
    devices = tf.config.list_logical_devices("GPU") if config["device"] == "cuda" else []
    serve_steps(run, {"compile_s": compile_s, "generator_params": trainable_count(model.generator),
                      "discriminator_params": trainable_count(model.discriminator), "tensorflow_version": tf.__version__,
                      "device_name": devices[0].name if devices else f"cpu ({config['threads']} threads)"})
