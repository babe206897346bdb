"""bench-train's plain step (karman's part, tasks.workloads.karman.bench.train) runs under torch's default switches whatever our trainer set in the same process."""

import torch


def test_the_plain_step_runs_without_cudnn_benchmark_and_the_setting_comes_back(monkeypatch):
    from models.device import resolve_device
    from tasks.workloads.karman.bench import train

    seen = []
    monkeypatch.setattr(train, "_plain_step", lambda *args: seen.append(torch.backends.cudnn.benchmark))
    plain = train._PlainTrainer(16, 1, 0, resolve_device("cpu"))
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True  # as models.device leaves it for a CUDA job
    try:
        plain.run(2)
        assert seen == [False, False]
        assert torch.backends.cudnn.benchmark is True
    finally:
        torch.backends.cudnn.benchmark = before
