"""Devices shared out: cells bound for different work pools run at the same time, one pool's cells one after the other.

The benchmark's lanes (flows.lanes.run_lanes) with real threads, and a pool's concurrency limit
(flows.lanes.device_slot) on a real Prefect API: two holders of one pool's limit never overlap,
a holder of another pool's runs beside them."""

import contextvars
import threading
import time

import pytest

from flows.lanes import device_slot, pool_limit, run_lanes

FLOW = contextvars.ContextVar("flow", default=None)


def test_lanes_run_side_by_side_and_each_lane_in_order():
    spans: dict[str, tuple[float, float, str]] = {}
    FLOW.set("benchmark")  # what the lanes' threads must see: the caller's context (its flow run)

    def run(job):
        name, _ = job
        t0 = time.monotonic()
        time.sleep(0.3)
        spans[name] = (t0, time.monotonic(), threading.current_thread().name)
        return {"cell": name, "flow": FLOW.get()}

    jobs = [("a1", None), ("g1", "gpu"), ("a2", None), ("t1", "tpu"), ("g2", "gpu")]
    t0 = time.monotonic()
    results = run_lanes(jobs, lambda job: job[1], run)
    assert [r["cell"] for r in results] == ["a1", "g1", "a2", "t1", "g2"] and {r["flow"] for r in results} == {"benchmark"}
    assert time.monotonic() - t0 < 0.9 * 5 * 0.3  # not one after the other
    assert spans["a1"][2] == spans["a2"][2] == threading.current_thread().name  # the cells run here stay in this thread
    for first, second in (("a1", "a2"), ("g1", "g2")):  # one lane: in order, never overlapping
        assert spans[first][1] <= spans[second][0]
    overlap = lambda x, y: spans[x][0] < spans[y][1] and spans[y][0] < spans[x][1]
    assert overlap("a1", "g1") and overlap("g1", "t1")  # different lanes: side by side
    assert run_lanes([], lambda job: None, run) == []


def test_a_failing_cell_in_a_lane_is_raised_after_the_other_lanes_end():
    ended = []

    def run(job):
        if job == "bad":
            raise RuntimeError("cell broke")
        time.sleep(0.2)
        ended.append(job)
        return {"cell": job}

    with pytest.raises(RuntimeError, match="cell broke"):
        run_lanes(["bad", "ok"], lambda job: "gpu" if job == "bad" else None, run)
    assert ended == ["ok"]


def test_two_holders_of_one_pools_limit_never_overlap_and_another_pool_runs_beside_them(prefect_harness, monkeypatch):
    import logging

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    with get_client(sync_client=True) as client:
        for pool in ("cpu", "gpu"):
            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=f"pool-{pool}", limit=1))
            except Exception:  # left by an earlier test in this session's API
                pass
    monkeypatch.delenv("KARMAN_POOL", raising=False)
    assert pool_limit() is None
    spans: dict[str, tuple[float, float]] = {}
    log = logging.getLogger("test")
    holding, gpu_holds = threading.Event(), threading.Event()

    def cell(name: str, pool: str, hold_s: float):
        with device_slot(log, pool):
            t0 = time.monotonic()
            holding.set()
            if name == "gpu-1":
                gpu_holds.set()
            elif name == "cpu-1":  # held until gpu-1 has its slot, or 60 s: a loaded host's slow API calls do not decide the order
                gpu_holds.wait(60)
            time.sleep(hold_s)
            spans[name] = (t0, time.monotonic())

    first = threading.Thread(target=cell, args=("cpu-1", "cpu", 0.5))
    first.start()
    assert holding.wait(60)  # cpu-1 holds the cpu pool's only slot; then the others ask for theirs
    others = [threading.Thread(target=cell, args=args) for args in (("cpu-2", "cpu", 0.5), ("gpu-1", "gpu", 0.5))]
    for t in others:
        t.start()
    for t in (first, *others):
        t.join(120)
    (a0, a1), (b0, b1), (g0, g1) = spans["cpu-1"], spans["cpu-2"], spans["gpu-1"]
    assert a1 <= b0, spans  # one pool: cpu-2 waited for cpu-1's slot
    assert g0 < a1, spans  # another pool: gpu-1 went ahead while cpu-1 held the cpu pool
